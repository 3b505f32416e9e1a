// Package hostaddr follows the addresses configured on a network namespace's interfaces:
// roostd's own, which a session's egress must treat as the host's (like loopback) because
// a service bound to 0.0.0.0 on the host answers on every one of them.
//
// The set is read in full when Watch starts and then kept by the kernel's address
// notifications (rtnetlink RTNLGRP_IPV4_IFADDR and RTNLGRP_IPV6_IFADDR). When the
// notification socket overflows (the kernel drops messages and reports ENOBUFS) or fails,
// the watch subscribes again and lists afresh, so a lost notification is not a lost address.
package hostaddr

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// receiveBuffer is the notification socket's buffer: big enough that a burst of changes
// (a VPN coming up, a container runtime making veths) seldom overflows it; when it does,
// the set is listed again.
const receiveBuffer = 1 << 20

// resubscribeEvery paces attempts to subscribe again after one failed.
const resubscribeEvery = time.Second

// Set is the addresses configured on one network namespace's interfaces, kept current
// until the context Watch was given ends. Its methods are safe for concurrent use.
type Set struct {
	mu sync.Mutex
	// addrs holds each address with the interfaces (by index) holding it: the same
	// address may sit on two, and leaves the set only when the last lets go.
	addrs map[netip.Addr]map[int]struct{}
	// now is addrs' keys, made afresh on every change: every egress decision reads it,
	// changes are rare, and a read takes no lock.
	now  atomic.Pointer[map[netip.Addr]struct{}]
	ns   netns.NsHandle
	h    *netlink.Handle
	log  *slog.Logger
	done chan struct{}
	// rcvbuf is the notification socket's buffer; relists counts the lists made afresh
	// after the notifications ended on their own.
	rcvbuf  int
	relists atomic.Int64
}

// Current is the network namespace of the calling goroutine's thread, which is every
// unlocked thread's: roostd's own. The caller closes it.
func Current() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ns, err := netns.Get()
	if err != nil {
		return netns.None(), fmt.Errorf("opening this process's network namespace: %w", err)
	}
	return ns, nil
}

// Watch lists the addresses of ns's interfaces and follows them until ctx ends. ns must
// stay open while the watch runs (the caller closes it after Done). log may be nil.
func Watch(ctx context.Context, ns netns.NsHandle, log *slog.Logger) (*Set, error) {
	return watch(ctx, ns, log, receiveBuffer)
}

func watch(ctx context.Context, ns netns.NsHandle, log *slog.Logger, rcvbuf int) (*Set, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink in the network namespace: %w", err)
	}
	s := &Set{addrs: map[netip.Addr]map[int]struct{}{}, ns: ns, h: h, log: log, done: make(chan struct{}), rcvbuf: rcvbuf}
	updates, stop, err := s.subscribe()
	if err != nil {
		h.Close()
		return nil, err
	}
	go s.follow(ctx, updates, stop)
	return s, nil
}

// Done is closed when the watch has stopped.
func (s *Set) Done() <-chan struct{} { return s.done }

// subscribe opens the notification socket, then lists: a change made between the two is
// in the list or in the notifications, and applying notifications in order over the list
// ends where the kernel did (each add or delete is the last word on its address).
func (s *Set) subscribe() (chan netlink.AddrUpdate, chan struct{}, error) {
	updates := make(chan netlink.AddrUpdate, 256)
	stop := make(chan struct{})
	ns := s.ns
	err := netlink.AddrSubscribeWithOptions(updates, stop, netlink.AddrSubscribeOptions{
		Namespace:              &ns,
		ReceiveBufferSize:      s.rcvbuf,
		ReceiveBufferForceSize: true,
		ErrorCallback: func(err error) {
			select {
			case <-stop:
				// The socket was shut on purpose.
			default:
				s.log.Warn("host address notifications", "err", err)
			}
		},
	})
	if err != nil {
		close(stop)
		return nil, nil, fmt.Errorf("subscribing to address changes: %w", err)
	}
	list, err := s.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		close(stop)
		return nil, nil, fmt.Errorf("listing the host's addresses: %w", err)
	}
	fresh := map[netip.Addr]map[int]struct{}{}
	for _, a := range list {
		if ip, ok := addrOf(a.IPNet.IP); ok {
			add(fresh, ip, a.LinkIndex)
		}
	}
	s.mu.Lock()
	s.addrs = fresh
	s.publish()
	s.mu.Unlock()
	return updates, stop, nil
}

func (s *Set) follow(ctx context.Context, updates chan netlink.AddrUpdate, stop chan struct{}) {
	defer close(s.done)
	defer s.h.Close()
	for {
		select {
		case <-ctx.Done():
			close(stop)
			for range updates {
				// The subscription closes the channel once its socket is shut.
			}
			return
		case u, ok := <-updates:
			if ok {
				s.apply(u)
				continue
			}
		}
		// The subscription ended on its own: an overflow or a failed read. What was
		// missed is unknown, so the set is listed again; until then it keeps what it had.
		close(stop)
		s.log.Warn("host address notifications ended; subscribing again and listing the addresses afresh")
		for {
			var err error
			if updates, stop, err = s.subscribe(); err == nil {
				s.relists.Add(1)
				break
			}
			s.log.Warn("host address notifications: subscribing again", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(resubscribeEvery):
			}
		}
	}
}

func (s *Set) apply(u netlink.AddrUpdate) {
	ip, ok := addrOf(u.LinkAddress.IP)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.NewAddr {
		add(s.addrs, ip, u.LinkIndex)
	} else if links := s.addrs[ip]; links != nil {
		delete(links, u.LinkIndex)
		if len(links) == 0 {
			delete(s.addrs, ip)
		}
	}
	s.publish()
}

// publish makes addrs what readers see; s.mu is held.
func (s *Set) publish() {
	now := make(map[netip.Addr]struct{}, len(s.addrs))
	for a := range s.addrs {
		now[a] = struct{}{}
	}
	s.now.Store(&now)
}

func add(m map[netip.Addr]map[int]struct{}, ip netip.Addr, link int) {
	if m[ip] == nil {
		m[ip] = map[int]struct{}{}
	}
	m[ip][link] = struct{}{}
}

// addrOf is an interface address as the set keeps it: unmapped, without a zone.
func addrOf(ip []byte) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// Contains says whether a is configured on one of the namespace's interfaces.
func (s *Set) Contains(a netip.Addr) bool {
	_, ok := (*s.now.Load())[a.Unmap().WithZone("")]
	return ok
}

// Addrs is the set now, sorted: for roostd's log and doctor.
func (s *Set) Addrs() []netip.Addr {
	now := *s.now.Load()
	out := make([]netip.Addr, 0, len(now))
	for a := range now {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}
