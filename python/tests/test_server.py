"""The client against a real dsec server.

Environment: DSEC_ADDR (and DSEC_TOKEN on TCP) name the server,
DSEC_TEST_IMAGE an image it has (with /bin/sh, cat, sleep, wc). Without
DSEC_ADDR the suite is skipped, unless DSEC_REQUIRE_SERVER=1, which turns
a missing or unreachable server into a failure.
"""

import io
import os
import sys
import tarfile
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dsec  # noqa: E402

ADDR = os.environ.get("DSEC_ADDR", "")
IMAGE = os.environ.get("DSEC_TEST_IMAGE", "")
REQUIRE = os.environ.get("DSEC_REQUIRE_SERVER") == "1"


def setUpModule():
    def unusable(why):
        if REQUIRE:
            raise RuntimeError("DSEC_REQUIRE_SERVER=1 but " + why)
        raise unittest.SkipTest(why)

    if not ADDR:
        unusable("DSEC_ADDR is not set")
    if not IMAGE:
        unusable("DSEC_TEST_IMAGE is not set")
    try:
        dsec.Client().health()
    except dsec.DsecError as e:
        unusable("the dsec server at %s is not reachable: %s" % (ADDR, e))


class ServerTest(unittest.TestCase):
    def setUp(self):
        self.client = dsec.Client()
        self.run_label = uuid.uuid4().hex[:8]

    def new_sandbox(self, **kw):
        labels = dict(kw.pop("labels", {}))
        labels["pytest"] = self.run_label
        sb = self.client.create(IMAGE, labels=labels, **kw)
        self.addCleanup(sb.delete, missing_ok=True)
        return sb


class TestSandboxes(ServerTest):
    def test_create_get_list_delete(self):
        sb = self.new_sandbox(cpu=0.5, memory="256Mi", idle_ttl=600, env={"SEED": "7"}, labels={"role": "a"})
        self.assertEqual(sb.state, "running")
        got = self.client.get(sb.id)
        spec = got.info["spec"]
        self.assertEqual(spec["memory_bytes"], 256 << 20)
        self.assertEqual(spec["idle_ttl"], 600 * 10**9)
        self.assertEqual(got.labels["role"], "a")
        self.new_sandbox(labels={"role": "b"})
        ids = [s.id for s in self.client.list(labels={"pytest": self.run_label, "role": "a"})]
        self.assertEqual(ids, [sb.id])
        self.assertEqual(len(self.client.list(labels={"pytest": self.run_label})), 2)
        sb.delete()
        with self.assertRaises(dsec.NotFound):
            self.client.get(sb.id)
        with self.assertRaises(dsec.NotFound):
            sb.delete()
        sb.delete(missing_ok=True)

    def test_context_manager_deletes_on_exception(self):
        seen = {}
        with self.assertRaises(RuntimeError):
            with self.client.sandbox(IMAGE, labels={"pytest": self.run_label}) as sb:
                seen["id"] = sb.id
                raise RuntimeError("rollout crashed")
        with self.assertRaises(dsec.NotFound):
            self.client.get(seen["id"])

    def test_pause_resume_stats_timeout_network(self):
        sb = self.new_sandbox()
        sb.pause()
        self.assertEqual(sb.refresh().state, "paused")
        self.assertIn(sb.id, [s.id for s in self.client.list(labels={"pytest": self.run_label}, state="paused")])
        sb.resume()
        self.assertEqual(sb.refresh().state, "running")
        st = sb.stats()
        self.assertEqual(st["id"], sb.id)
        sb.set_timeout(600)
        sb.set_network({"allow": ["10.0.0.0/8:443/tcp"]})
        allow = sb.refresh().info["spec"]["network"].get("allow") or []
        self.assertEqual(allow, [{"cidr": "10.0.0.0/8", "ports": "443", "protocol": "tcp"}])

    def test_errors(self):
        with self.assertRaises(dsec.NotFound):
            self.client.get("sb-does-not-exist")
        with self.assertRaises(dsec.NotFound):
            self.client.create("no-such-image-" + self.run_label)
        with self.assertRaises(dsec.InvalidArgument):
            self.client.create(IMAGE, memory="lots")

    @unittest.skipUnless(ADDR.startswith(("tcp:", "http:", "https:")), "the unix socket needs no token")
    def test_bad_token(self):
        with self.assertRaises(dsec.Unauthorized):
            dsec.Client(token="dsec_not_a_real_token").list()

    def test_snapshot_and_fork(self):
        sb = self.new_sandbox()
        sb.files.mkdir("/work")
        sb.files.write("/work/state.txt", "step 1")
        forks = sb.fork(2)
        for f in forks:
            self.addCleanup(f.delete, missing_ok=True)
        self.assertEqual(len(forks), 2)
        self.assertNotEqual(forks[0].id, forks[1].id)
        self.assertEqual(forks[0].files.read("/work/state.txt"), b"step 1")
        ref = "pytest-snap-%s:v1" % self.run_label
        img = sb.snapshot(ref)
        self.addCleanup(lambda: self._remove_image(ref))
        self.assertEqual(img["name"], ref)
        self.assertIn(ref, [i["name"] for i in self.client.images()])

    def _remove_image(self, ref):
        try:
            self.client.remove_image(ref)
        except dsec.NotFound:
            pass

    def test_import_image_upload(self):
        # A tiny root file-system tar, streamed from a file object.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, data in (("etc/hostname", b"pytest\n"), ("srv/data.bin", os.urandom(200 << 10))):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tf.addfile(info, io.BytesIO(data))
        buf.seek(0)
        ref = "pytest-import-%s:v1" % self.run_label
        frames = []
        img = self.client.import_image(ref, data=buf, progress=frames.append)
        self.addCleanup(lambda: self._remove_image(ref))
        self.assertEqual(img["name"], ref)
        self.assertTrue(frames, "no progress frames")
        self.assertEqual(self.client.image(ref)["name"], ref)
        with self.assertRaises(dsec.InvalidArgument):
            self.client.import_image(ref)  # neither path nor data

    def test_nodes_and_capacity(self):
        nodes = self.client.nodes()
        self.assertGreaterEqual(len(nodes), 1)
        self.assertGreater(nodes[0]["cpus"], 0)
        cap = self.client.capacity(cpu=1, memory="512Mi")
        self.assertIn("fits", cap)


class TestExec(ServerTest):
    @classmethod
    def setUpClass(cls):
        cls.sb = dsec.Client().create(IMAGE, labels={"pytest": "exec"})

    @classmethod
    def tearDownClass(cls):
        cls.sb.delete(missing_ok=True)

    def test_output_and_exit_code(self):
        r = self.sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.ok), ("out\n", "err\n", 3, False))
        self.assertTrue(r.exec_id)

    def test_shell_env_cwd(self):
        self.sb.files.mkdir("/work")
        r = self.sb.exec("echo $X; pwd", env={"X": "42"}, cwd="/work")
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "42")
        self.assertTrue(lines[1].endswith("/work"), lines)
        self.assertTrue(r.ok)

    def test_stdin(self):
        self.assertEqual(self.sb.exec(["cat"], stdin=b"hello").stdout, "hello")
        self.assertEqual(self.sb.exec(["cat"], stdin="text").stdout, "text")
        # Output larger than pipe and socket buffers while stdin is still
        # being sent: needs stdin and output to flow at the same time.
        r = self.sb.exec(["cat"], stdin=b"y" * (4 << 20))
        self.assertEqual(len(r.stdout_bytes), 4 << 20)
        big = io.BytesIO(b"x" * (1 << 20))
        self.assertEqual(self.sb.exec(["wc", "-c"], stdin=big).stdout.strip(), str(1 << 20))

    def test_full_duplex(self):
        # stdin is held back until the process has printed "ready": this
        # only finishes if output streams while the request is still open.
        ready = threading.Event()

        def stdin():
            if not ready.wait(10):
                return
            yield b"ping\n"

        chunks = []
        result = None
        for item in self.sb.exec_stream(["sh", "-c", "echo ready; read x; echo got $x"], stdin=stdin(), timeout=20):
            if isinstance(item, dsec.ExecResult):
                result = item
                continue
            chunks.append(item)
            if b"ready" in b"".join(d for s, d in chunks if s == "stdout"):
                ready.set()
        self.assertIsNotNone(result)
        self.assertEqual(result.stdout, "ready\ngot ping\n")
        self.assertEqual(result.exit_code, 0)

    def test_stream_items(self):
        items = list(self.sb.exec_stream(["sh", "-c", "echo a; echo b >&2"]))
        self.assertIsInstance(items[-1], dsec.ExecResult)
        self.assertIn(("stdout", b"a\n"), items)
        self.assertIn(("stderr", b"b\n"), items)

    def test_timeout(self):
        t0 = time.monotonic()
        r = self.sb.exec(["sleep", "30"], timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertFalse(r.ok)
        self.assertLess(time.monotonic() - t0, 20)

    def test_exec_list_and_wait(self):
        r = self.sb.exec(["true"])
        self.assertIn(r.exec_id, [e["exec_id"] for e in self.sb.execs()])
        self.assertEqual(self.sb.wait_exec(r.exec_id).exit_code, 0)
        with self.assertRaises(dsec.NotFound):
            self.sb.wait_exec("no-such-exec")

    def test_exec_output_kept(self):
        r = self.sb.exec("echo kept; echo also >&2")
        self.assertEqual(self.sb.exec_output(r.exec_id), b"kept\n")
        self.assertEqual(self.sb.exec_output(r.exec_id, "stderr"), b"also\n")
        self.assertEqual(self.sb.wait_exec(r.exec_id).output_bytes, len(b"kept\nalso\n"))
        with self.assertRaises(dsec.InvalidArgument):
            self.sb.exec_output(r.exec_id, "stdin")
        with self.assertRaises(dsec.NotFound):
            self.sb.exec_output("0123456789abcdef")

    def test_missing_sandbox(self):
        ghost = dsec.Sandbox(self.client, {"id": "sb-ghost"})
        with self.assertRaises(dsec.NotFound):
            ghost.exec(["true"])


class TestFiles(ServerTest):
    def test_round_trip(self):
        sb = self.new_sandbox()
        f = sb.files
        f.mkdir("/work/d")
        info = f.write("/work/d/a.txt", "hello\n", mode=0o600)
        self.assertEqual(info["size"], 6)
        self.assertEqual(f.read("/work/d/a.txt"), b"hello\n")
        self.assertEqual(f.stat("/work/d/a.txt")["mode"] & 0o777, 0o600)
        blob = os.urandom(3 << 20)
        f.write("/work/d/blob.bin", io.BytesIO(blob))
        self.assertEqual(f.read("/work/d/blob.bin"), blob)
        names = sorted(e["path"] for e in f.list("/work", depth=2))
        self.assertEqual(names, ["/work/d", "/work/d/a.txt", "/work/d/blob.bin"])
        self.assertEqual([e["path"] for e in f.list("/work")], ["/work/d"])
        # Files written through the API are what processes see.
        self.assertEqual(sb.exec(["cat", "a.txt"], cwd="/work/d").stdout, "hello\n")
        f.rename("/work/d/a.txt", "/work/b.txt")
        self.assertFalse(f.exists("/work/d/a.txt"))
        self.assertTrue(f.exists("/work/b.txt"))
        with self.assertRaises(dsec.NotFound):
            f.read("/work/d/a.txt")
        with self.assertRaises(dsec.DsecError):
            f.remove("/work/d")  # not empty
        f.remove("/work/d", recursive=True)
        self.assertFalse(f.exists("/work/d"))


if __name__ == "__main__":
    unittest.main()
