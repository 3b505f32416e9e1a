package etcdstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"go.uber.org/goleak"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// Every client, watch and member ends with its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func open(t testing.TB, endpoints []string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(etcdstore.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func get(t testing.TB, s fleet.Store, key string) (fleet.KV, bool) {
	t.Helper()
	kvs, _, err := s.Get(timeout(t, 10*time.Second), key, false)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	if len(kvs) == 0 {
		return fleet.KV{}, false
	}
	return kvs[0], true
}

func txn(t testing.TB, s fleet.Store, cmps []fleet.Cmp, then ...fleet.Op) bool {
	t.Helper()
	ok, err := s.Txn(timeout(t, 10*time.Second), cmps, then)
	if err != nil {
		t.Fatalf("txn: %v", err)
	}
	return ok
}

func put(k, v string) fleet.Op { return fleet.Op{Key: k, Value: []byte(v)} }

// One member serves the tests that fault nothing.
func TestOneMember(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	s := open(t, c.Endpoints())

	t.Run("CAS", func(t *testing.T) {
		absent := []fleet.Cmp{{Key: "cas/k", ModRevision: 0}}
		if !txn(t, s, absent, put("cas/k", "1"), put("cas/block", "b1")) {
			t.Fatal("create-if-absent of an absent key did not apply")
		}
		kv, _ := get(t, s, "cas/k")
		if string(kv.Value) != "1" || kv.ModRevision == 0 {
			t.Fatalf("after create: %+v", kv)
		}
		if b, _ := get(t, s, "cas/block"); b.ModRevision != kv.ModRevision {
			t.Fatalf("one Txn's puts at two revisions: %d, %d", kv.ModRevision, b.ModRevision)
		}
		if txn(t, s, absent, put("cas/k", "again")) {
			t.Fatal("create-if-absent of a present key applied")
		}
		cur := []fleet.Cmp{{Key: "cas/k", ModRevision: kv.ModRevision}}
		if !txn(t, s, cur, put("cas/k", "2")) {
			t.Fatal("a compare at the key's revision did not apply")
		}
		if txn(t, s, cur, put("cas/k", "stale")) {
			t.Fatal("a compare at a stale revision applied")
		}
		kv2, _ := get(t, s, "cas/k")
		if string(kv2.Value) != "2" || kv2.ModRevision <= kv.ModRevision {
			t.Fatalf("after the CAS: %+v (before: %+v)", kv2, kv)
		}
		// Every compare must hold: one stale compare among good ones applies nothing.
		both := []fleet.Cmp{{Key: "cas/k", ModRevision: kv2.ModRevision}, {Key: "cas/block", ModRevision: kv.ModRevision - 1}}
		if txn(t, s, both, put("cas/k", "3")) {
			t.Fatal("a Txn with one failing compare applied")
		}
		if !txn(t, s, []fleet.Cmp{{Key: "cas/k", ModRevision: kv2.ModRevision}}, fleet.Op{Key: "cas/k", Delete: true}) {
			t.Fatal("a delete at the key's revision did not apply")
		}
		if _, ok := get(t, s, "cas/k"); ok {
			t.Fatal("deleted key still there")
		}
		if !txn(t, s, absent, put("cas/k", "reborn")) {
			t.Fatal("create-if-absent of a deleted key did not apply")
		}
	})

	t.Run("GetPrefixAtOneRevision", func(t *testing.T) {
		for i := range 5 {
			txn(t, s, nil, put(fmt.Sprintf("pre/blocks/b%d", i), strconv.Itoa(i)))
		}
		txn(t, s, nil, put("pre/blocksX", "not under pre/blocks/"), put("pre/other", "x"))
		kvs, rev, err := s.Get(timeout(t, 10*time.Second), "pre/blocks/", true)
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != 5 {
			t.Fatalf("prefix get: %d keys, want 5: %+v", len(kvs), kvs)
		}
		for i, kv := range kvs {
			if kv.Key != fmt.Sprintf("pre/blocks/b%d", i) || string(kv.Value) != strconv.Itoa(i) || kv.ModRevision > rev {
				t.Fatalf("key %d: %+v at read revision %d", i, kv, rev)
			}
		}
		// The revision is the store's, not the newest key's: a later write elsewhere moves it.
		txn(t, s, nil, put("pre/other", "y"))
		_, rev2, err := s.Get(timeout(t, 10*time.Second), "pre/blocks/", true)
		if err != nil {
			t.Fatal(err)
		}
		if rev2 <= rev {
			t.Fatalf("read revision %d after a write, was %d", rev2, rev)
		}
		if kvs, _, err := s.Get(timeout(t, 10*time.Second), "pre/none/", true); err != nil || len(kvs) != 0 {
			t.Fatalf("empty prefix: %v, %v", kvs, err)
		}
	})

	t.Run("WatchFromRevisionWithDeletes", func(t *testing.T) {
		txn(t, s, nil, put("w/a", "before"))
		_, from, err := s.Get(timeout(t, 10*time.Second), "w/", true)
		if err != nil {
			t.Fatal(err)
		}
		// Changes made after from but before the watch starts are reported too.
		txn(t, s, nil, put("w/a", "1"))
		txn(t, s, nil, put("w/b", "2"), put("outside", "z"))
		ctx, cancel := context.WithCancel(context.Background())
		ch := s.Watch(ctx, "w/", true, from)
		txn(t, s, nil, fleet.Op{Key: "w/a", Delete: true})
		var got []fleet.KV
		deadline := time.After(10 * time.Second)
		for len(got) < 3 {
			select {
			case batch, ok := <-ch:
				if !ok {
					t.Fatalf("watch closed after %+v", got)
				}
				got = append(got, batch...)
			case <-deadline:
				t.Fatalf("watch reported %+v, want 3 changes", got)
			}
		}
		if len(got) != 3 ||
			got[0].Key != "w/a" || string(got[0].Value) != "1" || got[0].Deleted ||
			got[1].Key != "w/b" || string(got[1].Value) != "2" ||
			got[2].Key != "w/a" || !got[2].Deleted || got[2].Value != nil ||
			got[0].ModRevision <= from || got[1].ModRevision <= got[0].ModRevision || got[2].ModRevision <= got[1].ModRevision {
			t.Fatalf("watch from %d: %+v", from, got)
		}
		cancel()
		for range ch { // closes once ctx ends
		}
	})

	t.Run("WatchOneKey", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		ch := s.Watch(ctx, "one/ceiling", false, 0)
		// A watch from now misses nothing written after it started; the key under the same
		// prefix but not the key itself is not reported.
		txn(t, s, nil, put("one/ceiling-other", "x"))
		txn(t, s, nil, put("one/ceiling", "100"))
		select {
		case batch := <-ch:
			if len(batch) != 1 || batch[0].Key != "one/ceiling" || string(batch[0].Value) != "100" {
				t.Fatalf("watch of one key: %+v", batch)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no change reported")
		}
		cancel()
		for range ch {
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		ctx := timeout(t, 10*time.Second)
		if _, _, err := s.Get(ctx, "", false); !errdefs.IsInvalidArgument(err) {
			t.Errorf("empty key get: %v", err)
		}
		if _, err := s.Txn(ctx, []fleet.Cmp{{Key: "k", ModRevision: -1}}, nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"k"`) {
			t.Errorf("negative revision: %v", err)
		}
		if _, err := s.Txn(ctx, nil, []fleet.Op{put("", "v")}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("empty key put: %v", err)
		}
		// etcd's own refusal comes through classified.
		_, err := s.Txn(ctx, nil, []fleet.Op{put("dup", "1"), put("dup", "2")})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"dup"`) {
			t.Errorf("duplicate key in one Txn: %v", err)
		}
		if _, ok := <-s.Watch(ctx, "", true, 0); ok {
			t.Error("a watch of the empty key reported something")
		}
	})

	t.Run("LostRequestIsUnavailableAndNotApplied", func(t *testing.T) {
		link := c.Link()
		cut := open(t, link.Endpoints())
		get(t, cut, "lost") // connected
		link.BlackholeRequests()
		_, err := cut.Txn(timeout(t, time.Second), []fleet.Cmp{{Key: "lost"}}, []fleet.Op{put("lost", "block")})
		if !errdefs.IsUnavailable(err) || !errdefs.IsDeadlineExceeded(err) {
			t.Fatalf("txn over a link that drops requests: %v, want unavailable (deadline)", err)
		}
		if !strings.Contains(err.Error(), "outcome unknown") || !strings.Contains(err.Error(), `"lost"`) {
			t.Errorf("error does not say the outcome is unknown, or which key: %v", err)
		}
		// Reading (from a client that reaches the cluster) tells: it was never applied.
		if kv, ok := get(t, s, "lost"); ok {
			t.Fatalf("a Txn whose request was dropped applied: %+v", kv)
		}
		link.Heal()
		link.DropConnections()
		if kv, ok := get(t, cut, "lost"); ok {
			t.Fatalf("after healing, the dropped Txn applied late: %+v", kv)
		}
	})
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f.pem")
	if err := os.WriteFile(file, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  etcdstore.Config
		want string
	}{
		{etcdstore.Config{}, "no endpoints"},
		{etcdstore.Config{Endpoints: []string{"127.0.0.1:2379"}}, "want a URL"},
		{etcdstore.Config{Endpoints: []string{"unix:///run/etcd.sock"}}, `scheme "unix"`},
		{etcdstore.Config{Endpoints: []string{"http://127.0.0.1"}}, "host:port"},
		{etcdstore.Config{Endpoints: []string{"http://127.0.0.1:2379/v3"}}, "nothing more"},
		{etcdstore.Config{Endpoints: []string{"https://127.0.0.1:2379"}, CertFile: file}, "both or neither"},
		{etcdstore.Config{Endpoints: []string{"http://127.0.0.1:2379"}, CAFile: file}, "no endpoint is https"},
		{etcdstore.Config{Endpoints: []string{"https://127.0.0.1:2379"}, CAFile: filepath.Join(dir, "none.pem")}, `CA file "` + dir},
		{etcdstore.Config{Endpoints: []string{"https://127.0.0.1:2379"}, CertFile: file, KeyFile: file}, "etcd TLS"},
	} {
		s, err := etcdstore.New(c.cfg)
		if err == nil {
			s.Close()
			t.Errorf("%+v: no error", c.cfg)
			continue
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want invalid argument naming %q", c.cfg, err, c.want)
		}
	}
	eps, err := etcdstore.ParseEndpoints(" https://10.0.0.1:2379, https://10.0.0.2:2379,")
	if err != nil || len(eps) != 2 || eps[1] != "https://10.0.0.2:2379" {
		t.Errorf("ParseEndpoints: %v, %v", eps, err)
	}
	for _, bad := range []string{"", " , ", "https://a:1,ftp://b:2"} {
		if _, err := etcdstore.ParseEndpoints(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseEndpoints(%q): %v", bad, err)
		}
	}
}

func TestTLS(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{TLS: true})
	f := c.TLSFiles()
	s, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), CAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !txn(t, s, []fleet.Cmp{{Key: "tls"}}, put("tls", "ok")) {
		t.Fatal("txn over TLS did not apply")
	}
	// Without a client certificate the members refuse the connection.
	anon, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), CAFile: f.CA})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, _, err := anon.Get(timeout(t, time.Second), "tls", false); err == nil {
		t.Fatal("a client without a certificate read")
	}
}

// A Txn the leader applied, whose reply never reached its client, and the leader killed
// before it could tell: the client gets an error, and re-reading finds the Txn applied.
func TestLeaderKilledAfterApplyIsAmbiguousAndReadable(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	leader := c.WaitLeader(t)
	link := c.Link(leader)
	node := open(t, link.Endpoints())
	var survivors []string
	for _, m := range c.Followers() {
		survivors = append(survivors, m.ClientURL())
	}
	other := open(t, survivors)
	get(t, node, "blocks/n1/b7") // connected, to the leader alone

	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	_, from, err := other.Get(timeout(t, 10*time.Second), "blocks/", true)
	if err != nil {
		t.Fatal(err)
	}
	watch := other.Watch(wctx, "blocks/", true, from)

	link.BlackholeReplies()
	done := make(chan error, 1)
	go func() {
		_, err := node.Txn(timeout(t, 30*time.Second), []fleet.Cmp{{Key: "blocks/n1/b7"}}, []fleet.Op{put("blocks/n1/b7", "held 1000")})
		done <- err
	}()
	var applied fleet.KV
	select {
	case batch, ok := <-watch:
		if !ok || len(batch) != 1 {
			t.Fatalf("watch: %+v, %v", batch, ok)
		}
		applied = batch[0]
	case <-time.After(20 * time.Second):
		t.Fatal("the Txn was not committed")
	}
	leader.Kill(t)
	err = <-done
	if err == nil {
		t.Fatal("the Txn whose reply was lost and whose leader died reported success")
	}
	if !errdefs.IsUnavailable(err) {
		t.Errorf("ambiguous Txn's error is not classified unavailable: %v", err)
	}
	kv, ok := get(t, other, "blocks/n1/b7")
	if !ok || string(kv.Value) != "held 1000" || kv.ModRevision != applied.ModRevision {
		t.Fatalf("re-read after the ambiguous Txn: %+v %v, the watch saw %+v", kv, ok, applied)
	}
	// The node, re-reading, sees the block is its own: the create-if-absent fails now.
	if txn(t, other, []fleet.Cmp{{Key: "blocks/n1/b7"}}, put("blocks/n1/b7", "again")) {
		t.Fatal("the block was granted twice")
	}
}

// A 3-member cluster keeps serving compare-and-swap Txns when its leader is killed under
// load; a writer that meets an error reads its idempotency key to learn the outcome, so every
// increment is counted exactly once.
func TestLeaderLossKeepsServingTxns(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	s := open(t, c.Endpoints())
	const writers, perWriter = 4, 25
	ctx := timeout(t, 60*time.Second)
	var done atomic.Int64
	var ambiguous atomic.Int64
	// incr adds one to the counter under op's idempotency key, once, whatever fails.
	incr := func(op string) error {
		for {
			kvs, _, err := s.Get(ctx, "counter", false)
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				continue
			}
			var rev int64
			n := 0
			if len(kvs) == 1 {
				rev = kvs[0].ModRevision
				n, _ = strconv.Atoi(string(kvs[0].Value))
			}
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			ok, err := s.Txn(short, []fleet.Cmp{{Key: "counter", ModRevision: rev}, {Key: op}},
				[]fleet.Op{put("counter", strconv.Itoa(n+1)), put(op, "done")})
			cancel()
			if err == nil && ok {
				return nil
			}
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				ambiguous.Add(1)
			}
			// Lost the race, or ambiguous: the idempotency key says whether it applied.
			for {
				kv, _, rerr := s.Get(ctx, op, false)
				if rerr == nil {
					if len(kv) == 1 {
						return nil
					}
					break
				}
				if ctx.Err() != nil {
					return rerr
				}
			}
		}
	}
	errc := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range perWriter {
				if err := incr(fmt.Sprintf("ops/w%d/%03d", w, i)); err != nil {
					errc <- err
					return
				}
				done.Add(1)
			}
			errc <- nil
		}()
	}
	for done.Load() < writers*perWriter/4 {
		time.Sleep(5 * time.Millisecond)
	}
	old := c.WaitLeader(t)
	old.Kill(t)
	killedAt := done.Load()
	for range writers {
		if err := <-errc; err != nil {
			t.Fatalf("a writer stopped: %v", err)
		}
	}
	if l := c.WaitLeader(t); l == old {
		t.Fatalf("killed leader %s leads", old.Name)
	}
	kv, _ := get(t, s, "counter")
	ops, _, err := s.Get(ctx, "ops/", true)
	if err != nil {
		t.Fatal(err)
	}
	if string(kv.Value) != strconv.Itoa(writers*perWriter) || len(ops) != writers*perWriter {
		t.Fatalf("counter %s, %d op keys; want %d of each", kv.Value, len(ops), writers*perWriter)
	}
	t.Logf("leader %s killed after %d of %d increments; %d ambiguous Txn errors resolved by reading", old.Name, killedAt, writers*perWriter, ambiguous.Load())
}

// A member cut off from the other two cannot apply: its client's Txn fails, classified
// unavailable, and the majority, which applies, is what a re-read finds.
func TestMinorityMemberRefusesTxn(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	c.WaitLeader(t)
	ms := c.Members()
	alone, rest := ms[0], ms[1:]
	lonely := open(t, []string{alone.ClientURL()})
	get(t, lonely, "pool")
	c.Partition([]*etcdtest.Member{alone}, rest)
	majority := open(t, []string{rest[0].ClientURL(), rest[1].ClientURL()})
	var err error
	for range 100 { // the majority elects a leader of its own if it had none
		if _, err = majority.Txn(timeout(t, 2*time.Second), []fleet.Cmp{{Key: "pool"}}, []fleet.Op{put("pool", "majority")}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("the majority's Txn: %v", err)
	}
	_, err = lonely.Txn(timeout(t, time.Second), nil, []fleet.Op{put("pool", "minority")})
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("the cut-off member's Txn: %v, want unavailable", err)
	}
	c.Heal()
	kv, _ := get(t, majority, "pool")
	if string(kv.Value) != "majority" {
		t.Fatalf("pool %q after healing", kv.Value)
	}
}

// A watch through a member that loses its leader ends, rather than go quiet while the rest
// of the cluster moves on (a node watching its day's ceiling learns it must re-read).
func TestWatchEndsWhenItsMemberLosesTheLeader(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	c.WaitLeader(t)
	ms := c.Members()
	alone := open(t, []string{ms[0].ClientURL()})
	get(t, alone, "ceiling")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := alone.Watch(ctx, "ceiling", false, 0)
	c.Partition(ms[:1], ms[1:])
	select {
	case batch, ok := <-ch:
		if ok {
			t.Fatalf("the cut-off member's watch reported %+v", batch)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cut-off member's watch is still open")
	}
}

// A client of all three members, one of them cut off from the others: the client's calls
// keep being served by the majority. The cut-off member, stepped down, answers "no leader"
// at once to a call that requires one, which the client takes to the next member; a call
// that did not require one would wait there for its deadline, every third call in turn (the
// client balances round-robin), and a node's look, several calls long, would fail every time.
func TestMinorityMemberDoesNotHoldCallsOfAClientOfAll(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	c.WaitLeader(t)
	s := open(t, c.Endpoints())
	txn(t, s, nil, put("pool", "0"))
	alone := c.Leader()
	c.Partition([]*etcdtest.Member{alone}, c.Followers())
	for alone.HasLeader() || c.Leader() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 30 {
		if _, _, err := s.Get(timeout(t, 300*time.Millisecond), "pool", false); err != nil {
			t.Fatalf("get %d with %s cut off: %v", i, alone.Name, err)
		}
		if _, err := s.Txn(timeout(t, 300*time.Millisecond), nil, []fleet.Op{put("pool", fmt.Sprint(i))}); err != nil {
			t.Fatalf("txn %d with %s cut off: %v", i, alone.Name, err)
		}
	}
}
