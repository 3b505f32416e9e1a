import io
import os
import shutil
import tarfile
import tempfile
import time
import unittest

from roost import FailedPreconditionError, FileType, InvalidArgumentError, NotFoundError, Roost

from roost._files import _extract

from daemon import Daemon


class FilesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        # Whatever fails after, the daemon goes: a second roostd could not claim the host's ids.
        cls.addClassCleanup(cls.d.stop)
        cls.roost = Roost.connect(socket=cls.d.socket)
        cls.s = cls.roost.sessions.create(capsule=cls.d.capsule("files", "echo made > made.txt; sleep 300"))

    @classmethod
    def tearDownClass(cls):
        cls.s.remove(force=True)
        cls.roost.close()

    def test_write_read_stat_list_mkdir_remove(self):
        f = self.s.files
        info = f.write("notes.txt", "first\n", mode=0o600)
        self.assertEqual((info.size, info.mode), (6, 0o600))
        self.assertEqual(f.read("notes.txt"), "first\n")
        # The session sees what was written, and the SDK what the session wrote.
        self.assertEqual(self.s.exec("cat notes.txt").stdout, "first\n")
        for _ in range(100):
            if f.exists("made.txt"):
                break
            time.sleep(0.05)
        self.assertEqual(f.read("made.txt"), "made\n")

        big = bytes(i % 251 for i in range(700_000))
        f.write("big.bin", big)
        self.assertEqual(f.read_bytes("big.bin"), big)
        self.assertEqual(f.read_bytes("big.bin", offset=10, length=5), big[10:15])

        f.mkdir("a/b/c", parents=True)
        f.write("a/b/c/x", b"x")
        self.assertLessEqual({"a", "big.bin", "made.txt", "notes.txt"}, {e.name for e in f.list(".")})
        self.assertEqual([e.name for e in f.list("a/b/c")], ["x"])
        self.assertEqual(f.stat("a").type, FileType.FILE_TYPE_DIRECTORY)

        with self.assertRaises(NotFoundError):
            f.read("nope")
        with self.assertRaises(InvalidArgumentError):
            f.read("../etc/passwd")
        with self.assertRaises(InvalidArgumentError):
            f.write("/etc/x", "x")
        with self.assertRaises(FailedPreconditionError):
            f.remove("a")
        f.remove("a", recursive=True)
        self.assertFalse(f.exists("a"))

    def test_upload_download(self):
        local = tempfile.mkdtemp(prefix="roost-sdk-py-tree-")
        try:
            src = os.path.join(local, "src")
            os.makedirs(os.path.join(src, "lib"))
            with open(os.path.join(src, "main.py"), "w") as out:
                out.write("print('hi')\n")
            with open(os.path.join(src, "lib", "util.py"), "w") as out:
                out.write("X = 1\n")
            os.symlink("main.py", os.path.join(src, "link"))
            up = self.s.upload(src, "proj")
            self.assertEqual((up.files, up.symlinks), (2, 1))
            self.assertEqual(self.s.exec("cat proj/lib/util.py").stdout, "X = 1\n")

            back = os.path.join(local, "back")
            self.s.download("proj", back)
            with open(os.path.join(back, "main.py")) as got:
                self.assertEqual(got.read(), "print('hi')\n")
            with open(os.path.join(back, "lib", "util.py")) as got:
                self.assertEqual(got.read(), "X = 1\n")
            self.assertEqual(os.readlink(os.path.join(back, "link")), "main.py")
        finally:
            shutil.rmtree(local)

    def test_archive_is_a_tar_stream(self):
        f = self.s.files
        f.mkdir("arch/sub", parents=True)
        f.write("arch/sub/a.txt", "in the archive\n")
        big = bytes(i % 253 for i in range(600_000))
        f.write("arch/big.bin", big)
        chunks = list(f.archive("arch"))
        # Streamed, not sent whole: more than roostd's one piece of an archive.
        self.assertGreater(len(chunks), 1)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
            members = {m.name: m for m in tar}
            self.assertEqual(sorted(members), ["big.bin", "sub", "sub/a.txt"])
            self.assertTrue(members["sub"].isdir())
            self.assertEqual(tar.extractfile(members["sub/a.txt"]).read(), b"in the archive\n")
            self.assertEqual(tar.extractfile(members["big.bin"]).read(), big)
        # The whole workdir by default; a path roostd refuses is its error, at the first read.
        with tarfile.open(fileobj=io.BytesIO(b"".join(f.archive())), mode="r:") as tar:
            self.assertIn("arch/sub/a.txt", tar.getnames())
        with self.assertRaises(InvalidArgumentError):
            list(f.archive("../etc"))
        with self.assertRaises(NotFoundError):
            list(f.archive("nope"))
        f.remove("arch", recursive=True)

    def test_download_keeps_links_as_links_and_no_setuid(self):
        r = self.s.exec("mkdir -p trap && ln -sfn /tmp trap/out && printf x > trap/prog && chmod 4755 trap/prog")
        self.assertEqual(r.exit_code, 0, r.stderr)
        local = tempfile.mkdtemp(prefix="roost-sdk-py-trap-")
        try:
            self.s.download("trap", local)
            self.assertEqual(os.readlink(os.path.join(local, "out")), "/tmp")
            # What a session wrote does not come out as a setuid program of this host's.
            self.assertEqual(os.stat(os.path.join(local, "prog")).st_mode & 0o7777, 0o755)
        finally:
            shutil.rmtree(local)


class ExtractTest(unittest.TestCase):
    """What download unpacks is held inside its directory, whatever the archive says."""

    def archive(self, *entries):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, kind, arg in entries:
                info = tarfile.TarInfo(name)
                if kind == "link":
                    info.type, info.linkname = tarfile.SYMTYPE, arg
                    tar.addfile(info)
                else:
                    info.size, info.mode = len(arg), 0o4755
                    tar.addfile(info, io.BytesIO(arg))
        buf.seek(0)
        return buf

    def test_refuses_a_way_through_a_link(self):
        outside = tempfile.mkdtemp(prefix="roost-sdk-py-outside-")
        local = tempfile.mkdtemp(prefix="roost-sdk-py-local-")
        try:
            with self.assertRaisesRegex(ValueError, "passes through a symlink"):
                _extract(self.archive(("out", "link", outside), ("out/evil", "file", b"x")), local)
            self.assertEqual(os.listdir(outside), [])
            with self.assertRaisesRegex(ValueError, "climbs out"):
                _extract(self.archive(("../evil", "file", b"x")), local)
            with self.assertRaisesRegex(ValueError, "climbs out"):
                _extract(self.archive(("/evil", "file", b"x")), local)
        finally:
            shutil.rmtree(outside)
            shutil.rmtree(local)

    def test_no_setuid_bit(self):
        local = tempfile.mkdtemp(prefix="roost-sdk-py-local-")
        try:
            _extract(self.archive(("prog", "file", b"#!/bin/sh\n")), local)
            self.assertEqual(os.stat(os.path.join(local, "prog")).st_mode & 0o7777, 0o755)
        finally:
            shutil.rmtree(local)

if __name__ == "__main__":
    unittest.main()
