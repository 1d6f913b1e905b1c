package pglaunch

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// Process is a child process started by StartTied: it dies with this one.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartTied starts cmd so that it gets sig when this process ends, however
// it ends (a SIGKILL of a test binary, or its -timeout panic, included), and
// in a session of its own (a Ctrl-C at a terminal reaches only us, who stop
// it properly). The process is waited for by StartTied's goroutine: use Done
// and Err, not cmd.Wait.
//
// On Linux the signal is the parent-death signal (prctl PR_SET_PDEATHSIG),
// which fires when the OS thread that started the child exits, not the
// process: the thread is locked to a goroutine that waits for the child,
// so it lives exactly as long as the child does (and exits with the
// process). Elsewhere there is no such signal: a process killed outright
// leaves its children running.
func StartTied(cmd *exec.Cmd, sig syscall.Signal) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	tie(cmd.SysProcAttr, sig)
	p := &Process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, after the
		// child has exited.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited (and been waited for).
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited (cmd.Wait's error), once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Signal sends sig to the process; one that has exited is not an error.
func (p *Process) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}
