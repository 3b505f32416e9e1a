import os
import time
import unittest

from roost import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    Roost,
    RoostError,
    UnavailableError,
)

from daemon import Daemon


class UnixSocketTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        # Whatever fails after, the daemon goes: a second roostd could not claim the host's ids.
        cls.addClassCleanup(cls.d.stop)
        cls.roost = Roost.connect(socket=cls.d.socket)

    @classmethod
    def tearDownClass(cls):
        for s in cls.roost.sessions.list():
            try:
                s.kill()
            except RoostError:
                pass
        cls.roost.close()

    def test_create_exec_kill_wait_remove(self):
        s = self.roost.sessions.create(capsule=self.d.capsule("sleeper", "echo started; sleep 300"), name="py-sleeper")
        self.assertEqual(s.state, "running")
        self.assertTrue(s.id.startswith("ses_"), s.id)
        self.assertEqual(s.name, "py-sleeper")

        r = s.exec("echo out; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (3, "out\n", "err\n"))
        self.assertIn("out\n", r.output)
        self.assertIn("3", r.detail)
        self.assertNotEqual(r.exec_id, "")

        r = s.exec(["/bin/sh", "-c", 'printf "%s|%s|" "$GREETING" "$(pwd)"; cat'],
                   env={"GREETING": "hi there"}, cwd="/tmp", stdin="from stdin")
        self.assertEqual(r.exit_code, 0, r.stderr)
        self.assertEqual(r.stdout, "hi there|/tmp|from stdin")

        self.assertEqual(self.roost.sessions.get("py-sleeper").id, s.id)
        self.assertIn(s.id, [x.id for x in self.roost.sessions.list()])

        started = time.monotonic()
        with self.assertRaises(DeadlineExceededError):
            s.exec("sleep 30", timeout=0.5)
        self.assertLess(time.monotonic() - started, 10, "the timeout ended the exec")

        self.assertEqual(s.kill().state, "exited")
        ended = s.wait()
        self.assertEqual(ended.exit_status, "terminated")
        self.assertEqual(s.exit_code, 137)
        self.assertEqual(s.logs(), ("started\n", ""))

        with self.assertRaises(FailedPreconditionError):
            s.exec("true")
        s.remove()
        with self.assertRaises(NotFoundError):
            self.roost.sessions.get(s.id)

    def test_labels(self):
        a = self.roost.sessions.create(capsule=self.d.capsule("labelled", "sleep 300"), labels={"team": "infra", "roost.example/tier": "gold"})
        b = self.roost.sessions.create(capsule=self.d.capsule("labelled", "sleep 300"), labels={"team": "web"})
        try:
            self.assertEqual(a.labels, {"team": "infra", "roost.example/tier": "gold"})
            self.assertEqual(self.roost.sessions.get(a.id).labels, a.labels)

            def ids(**kw):
                return sorted(s.id for s in self.roost.sessions.list(labels=kw["labels"]))

            self.assertEqual(ids(labels={"team": "infra"}), [a.id])
            self.assertEqual(ids(labels={"team": ""}), sorted([a.id, b.id]))
            self.assertEqual(ids(labels={"team": "web", "roost.example/tier": ""}), [])
            with self.assertRaises(InvalidArgumentError):
                self.roost.sessions.create(capsule=self.d.capsule("labelled", "true"), labels={"-bad": "x"})
        finally:
            a.remove(force=True)
            b.remove(force=True)

    def test_background_execs(self):
        with self.roost.sessions.create(capsule=self.d.capsule("background", "sleep 300")) as s:
            h = s.exec("echo out; echo err >&2; exit 4", background=True)
            self.assertNotEqual(h.exec_id, "")
            r = h.wait()
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (4, "out\n", "err\n"))

            long = s.exec(["sleep", "300"], background=True)
            self.assertEqual(long.kill().exec_id, long.exec_id)
            ended = long.wait()
            self.assertEqual(ended.exit_code, 137, ended.detail)
            execs = s.execs()
            self.assertEqual([x.exec_id for x in execs], [h.exec_id, long.exec_id])
            self.assertEqual(execs[1].signal, "SIGKILL")

            # A command the session cannot run is a handle already ended.
            refused = s.exec(["/nonexistent/prog"], background=True)
            self.assertEqual(refused.wait().exit_code, 127)
            with self.assertRaises(FailedPreconditionError):
                refused.kill()

    def test_exec_streams_its_output(self):
        with self.roost.sessions.create(capsule=self.d.capsule("streamed", "sleep 300")) as s:
            # The command ends only once the caller has seen its first line: had exec kept the
            # output until the command's end, it would run into its timeout instead.
            seen = []

            def on_stdout(data):
                seen.append(data)
                if "ready" in data and not s.files.exists("go"):
                    s.files.write("go", "")

            r = s.exec("echo ready; echo warn >&2; while [ ! -e go ]; do sleep 0.05; done; echo done",
                       timeout=60, on_stdout=on_stdout, on_stderr=lambda data: seen.append("err:" + data))
            self.assertEqual(r.exit_code, 0, r.stderr)
            self.assertEqual(r.stdout, "ready\ndone\n")
            self.assertEqual("".join(x for x in seen if not x.startswith("err:")), r.stdout)
            self.assertEqual([x for x in seen if x.startswith("err:")], ["err:warn\n"])

    def test_background_exec_reattached_from_an_offset(self):
        with self.roost.sessions.create(capsule=self.d.capsule("reattach", "sleep 300")) as s:
            h = s.exec("echo one; while [ ! -e go ]; do sleep 0.05; done; echo two; echo bad >&2; exit 5", background=True)
            # exec returned while the command waits: it runs on, detached.
            self.assertEqual([x.state for x in s.execs() if x.exec_id == h.exec_id], ["running"])
            s.files.write("go", "")
            again = s.attach_exec(h.exec_id)
            seen = []
            r = again.wait(stdout_offset=len(b"one\n"), on_stdout=seen.append)
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (5, "two\n", "bad\n"))
            self.assertEqual("".join(seen), "two\n")
            self.assertEqual(again.wait().stdout, "one\ntwo\n")
            with self.assertRaises(ValueError):
                s.attach_exec("")
            with self.assertRaises(NotFoundError):
                s.attach_exec("exec_000000000000").wait()

    def test_wait_returns_the_exit_code(self):
        with self.roost.sessions.create(capsule=self.d.capsule("three", "exit 3")) as s:
            ended = s.wait()
            self.assertEqual((ended.exit_code, ended.exit_status), (3, "error"))
        with self.assertRaises(NotFoundError):
            s.refresh()

    def test_context_manager_removes_a_live_session(self):
        with self.roost.sessions.create(capsule=self.d.capsule("live", "sleep 300")) as s:
            self.assertEqual(s.state, "running")
        with self.assertRaises(NotFoundError):
            self.roost.sessions.get(s.id)

    def test_relative_capsule_path(self):
        d = self.d.capsule("relative", "exit 0")
        cwd = os.getcwd()
        os.chdir(os.path.dirname(d))
        try:
            s = self.roost.sessions.create(capsule="relative")
        finally:
            os.chdir(cwd)
        self.assertEqual(s.record.capsule.source, d)
        s.wait()
        s.remove()

    def test_pushed_capsule_by_name(self):
        art = self.roost.artifacts.push(self.d.capsule("pushed", "echo pushed"))
        self.assertEqual(f"{art.name}@{art.version}", "pushed@0.1.0")
        s = self.roost.sessions.create(capsule="pushed@0.1.0")
        s.wait()
        self.assertEqual(s.logs()[0], "pushed\n")
        s.remove()
        self.roost.artifacts.remove("pushed@0.1.0")
        with self.assertRaises(NotFoundError):
            self.roost.sessions.create(capsule="pushed@0.1.0")

    def test_errors_are_typed(self):
        with self.assertRaises(NotFoundError) as cm:
            self.roost.sessions.get("ses_nosuchsession")
        self.assertIsInstance(cm.exception, RoostError)
        self.assertIn("ses_nosuchsession", str(cm.exception))
        with self.assertRaises(InvalidArgumentError):
            self.roost.sessions.create(capsule=self.d.capsule("badname", "true"), name="Not A Name")
        s = self.roost.sessions.create(capsule=self.d.capsule("taken", "sleep 300"), name="taken")
        with self.assertRaises(AlreadyExistsError):
            self.roost.sessions.create(capsule=self.d.capsule("taken", "sleep 300"), name="taken")
        s.remove(force=True)
        with self.assertRaises(ValueError):
            self.roost.sessions.create(capsule="")


class UnreachableTest(unittest.TestCase):
    def test_unreachable_socket(self):
        with Roost.connect(socket="/nonexistent/roostd.sock") as roost:
            with self.assertRaises(UnavailableError):
                roost.version()


if __name__ == "__main__":
    unittest.main()
