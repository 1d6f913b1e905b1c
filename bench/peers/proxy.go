package main

import (
	"io"
	"net"
	"sync"
	"time"
)

// delayProxy forwards TCP connections on loopback to upstream and delays every chunk
// of the upstream's responses by a fixed time: a round trip over a network, for
// LATENCY_MS. Requests pass at once, so each round trip gains the delay once. It runs in
// the runner's process, so its CPU is neither the server's nor the client's.
type delayProxy struct {
	addr  string
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startDelayProxy(upstream string, delay time.Duration) (*delayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &delayProxy{addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, upstream, delay)
		}
	}()
	return p, nil
}

func (p *delayProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *delayProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *delayProxy) serve(client net.Conn, upstream string, delay time.Duration) {
	server, err := net.Dial("tcp", upstream)
	if err != nil {
		client.Close()
		return
	}
	p.track(client, server)
	defer p.untrack(client, server)
	done := make(chan struct{}, 2)
	go func() { // requests: at once
		_, _ = io.Copy(server, client)
		_ = server.(*net.TCPConn).CloseWrite()
		done <- struct{}{}
	}()
	go func() { // responses: each chunk written delay after it arrived, in order
		type chunk struct {
			b  []byte
			at time.Time
		}
		ch := make(chan chunk, 4096)
		go func() {
			defer close(ch)
			for {
				buf := make([]byte, 32<<10)
				n, err := server.Read(buf)
				if n > 0 {
					ch <- chunk{buf[:n], time.Now().Add(delay)}
				}
				if err != nil {
					return
				}
			}
		}()
		for c := range ch {
			time.Sleep(time.Until(c.at))
			if _, err := client.Write(c.b); err != nil {
				break
			}
		}
		_ = client.(*net.TCPConn).CloseWrite()
		for range ch { // drain, so the reader can end
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

func (p *delayProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}
