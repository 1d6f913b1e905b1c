package pglaunch

import "syscall"

// tie makes the child get sig when the thread that starts it exits.
func tie(attr *syscall.SysProcAttr, sig syscall.Signal) { attr.Pdeathsig = sig }
