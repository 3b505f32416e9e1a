import unittest

from roost import PermissionDeniedError, Roost, UnavailableError

from daemon import Daemon


class RemoteTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon.remote()
        # Whatever fails after, the daemon goes: a second roostd could not claim the host's ids.
        cls.addClassCleanup(cls.d.stop)

    def test_pushed_capsule_exec_kill_remove(self):
        with Roost.connect(**self.d.as_client("sdk")) as roost:
            # Paths are roostd's over the listener: this host is roostd's here.
            art = roost.artifacts.push(self.d.capsule("remote", "sleep 300"))
            s = roost.sessions.create(capsule=f"{art.name}@{art.version}")
            self.assertEqual(s.state, "running")
            r = s.exec(["/bin/sh", "-c", "cat; echo $X"], stdin="in\n", env={"X": "over tls"})
            self.assertEqual(r.stdout, "in\nover tls\n")
            s.kill()
            self.assertEqual(s.wait().exit_status, "terminated")
            s.remove()

    def test_reader_reads_and_may_not_kill(self):
        with Roost.connect(**self.d.as_client("sdk")) as op, Roost.connect(**self.d.as_client("viewer")) as viewer:
            s = op.sessions.create(capsule=self.d.capsule("watched", "sleep 300"))
            seen = viewer.sessions.get(s.id)
            self.assertEqual(seen.state, "running")
            with self.assertRaises(PermissionDeniedError):
                seen.kill()
            s.remove(force=True)

    def test_certificate_of_another_ca_is_refused(self):
        opts = self.d.as_client("stranger") | {"ca": self.d.as_client("sdk")["ca"]}
        with Roost.connect(**opts) as stranger:
            with self.assertRaises(UnavailableError):
                stranger.version()

    def test_server_without_a_client_certificate(self):
        with self.assertRaisesRegex(ValueError, "cert is required"):
            Roost.connect(server=self.d.server, ca=self.d.as_client("sdk")["ca"])


if __name__ == "__main__":
    unittest.main()
