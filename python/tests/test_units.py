"""Offline tests of the client's argument handling (no server needed)."""

import datetime
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dsec  # noqa: E402


class TestSizes(unittest.TestCase):
    def test_good(self):
        for given, want in [(0, 0), (4096, 4096), ("512Mi", 512 << 20), ("1Gi", 1 << 30), ("1.5Gi", 3 << 29),
                            ("1G", 10**9), ("10k", 10**4), ("2Ti", 2 << 40), ("512MiB", 512 << 20), (" 4Ki ", 4096),
                            (None, 0), (2.0, 2)]:
            self.assertEqual(dsec.parse_size(given), want, given)

    def test_bad(self):
        for given in ["", "Mi", "-1Gi", "1Xi", "lots", "1.5", -1, True, 1.5, [1], "1e30Gi"]:
            with self.assertRaises(dsec.InvalidArgument, msg=repr(given)):
                dsec.parse_size(given)


class TestDurations(unittest.TestCase):
    def test_good(self):
        self.assertEqual(dsec.to_nanoseconds(300), 300 * 10**9)
        self.assertEqual(dsec.to_nanoseconds(0.25), 250 * 10**6)
        self.assertEqual(dsec.to_nanoseconds(datetime.timedelta(minutes=5)), 300 * 10**9)
        self.assertEqual(dsec.to_nanoseconds(None), 0)

    def test_bad(self):
        for given in [-1, float("nan"), float("inf"), "30s", True]:
            with self.assertRaises(dsec.InvalidArgument, msg=repr(given)):
                dsec.to_nanoseconds(given)


class TestNetwork(unittest.TestCase):
    def test_rules(self):
        cases = {
            "preset:pypi": {"preset": "pypi"},
            "10.0.0.0/8": {"cidr": "10.0.0.0/8"},
            "1.2.3.4:443/tcp": {"cidr": "1.2.3.4", "ports": "443", "protocol": "tcp"},
            "10.0.0.0/8:8000-9000/udp": {"cidr": "10.0.0.0/8", "ports": "8000-9000", "protocol": "udp"},
            "2001:db8::/32": {"cidr": "2001:db8::/32"},
            "[2001:db8::/32]:443": {"cidr": "2001:db8::/32", "ports": "443"},
        }
        for given, want in cases.items():
            self.assertEqual(dsec.parse_rule(given), want, given)
        for bad in ["pypi.org", "10.0.0.1/8", "1.2.3.4:0", "1.2.3.4:9-8", "1.2.3.4:http", "preset:", "[::1", "", "1.2.3.4/sctp"]:
            with self.assertRaises(dsec.InvalidArgument, msg=bad):
                dsec.parse_rule(bad)

    def test_policy(self):
        pol = dsec.network_policy({"pypi": True, "npm": False, "allow": ["10.0.0.0/8:443"], "deny": ["10.0.0.5"]})
        self.assertEqual(pol, {"allow": [{"cidr": "10.0.0.0/8", "ports": "443"}, {"preset": "pypi"}],
                               "deny": [{"cidr": "10.0.0.5"}]})
        self.assertEqual(dsec.network_policy(None), {})
        self.assertEqual(dsec.network_policy({"allow": [{"cidr": "1.1.1.1"}]}), {"allow": [{"cidr": "1.1.1.1"}]})
        for bad in [{"deny": ["preset:pypi"]}, {"Bad Name": True}, ["pypi"], {"allow": [{"host": "x"}]}]:
            with self.assertRaises(dsec.InvalidArgument, msg=repr(bad)):
                dsec.network_policy(bad)


class TestClientArgs(unittest.TestCase):
    def test_addresses(self):
        self.assertEqual(dsec.Client("unix:///tmp/x.sock")._unix, "/tmp/x.sock")
        c = dsec.Client("tcp://127.0.0.1:7070", token="t")
        self.assertEqual((c._host, c._port, c.token), ("127.0.0.1", 7070, "t"))
        for bad in ["ftp://x", "unix://", "tcp://", "127.0.0.1:80"]:
            with self.assertRaises(dsec.InvalidArgument, msg=bad):
                dsec.Client(bad)

    def test_env_defaults(self):
        old = dict(os.environ)
        try:
            os.environ["DSEC_ADDR"] = "tcp://10.9.8.7:1"
            os.environ["DSEC_TOKEN"] = "from-env"
            c = dsec.Client()
            self.assertEqual((c._host, c.token), ("10.9.8.7", "from-env"))
            del os.environ["DSEC_ADDR"]
            self.assertEqual(dsec.Client()._unix, "/run/dsec/dsec.sock")
        finally:
            os.environ.clear()
            os.environ.update(old)

    def test_bad_create_args_never_reach_the_server(self):
        # An address nobody listens on: any request would raise Unavailable.
        c = dsec.Client("unix:///nonexistent/dsec.sock")
        for kwargs in [dict(image=""), dict(image="x", memory="lots"), dict(image="x", idle_ttl=-1),
                       dict(image="x", on_idle="nap"), dict(image="x", qos="fast"), dict(image="x", cpu=-1),
                       dict(image="x", env={"1BAD": "x"}), dict(image="x", network={"allow": ["nope"]}),
                       dict(image="x", labels={"": "v"})]:
            with self.assertRaises(dsec.InvalidArgument, msg=repr(kwargs)):
                c.create(**kwargs)
        with self.assertRaises(dsec.Unavailable):
            c.create(image="x")

    def test_exec_request(self):
        sb = dsec.Sandbox(dsec.Client("unix:///nonexistent.sock"), {"id": "sb-1"})
        req = sb._exec_request(["python", "-c", "1"], "/w", {"A": "1"}, "1000", 2.5, "1Mi", None)
        self.assertEqual(req, {"sandbox_id": "sb-1", "args": ["python", "-c", "1"], "cwd": "/w", "env": ["A=1"],
                               "user": "1000", "timeout": 2500000000, "output_cap": 1 << 20})
        self.assertEqual(sb._exec_request("echo hi", None, None, None, None, None, None)["shell"], "echo hi")
        for bad in ["", [], [1], None]:
            with self.assertRaises(dsec.InvalidArgument):
                sb._exec_request(bad, None, None, None, None, None, None)
        for bad in ["relative", "", None]:
            with self.assertRaises(dsec.InvalidArgument):
                sb.files.stat(bad)


class TestErrors(unittest.TestCase):
    def test_code_wins_over_status(self):
        e = dsec._error(409, b'{"error":"sandbox x exists","code":"already_exists"}')
        self.assertIsInstance(e, dsec.AlreadyExists)
        self.assertEqual((e.status, e.code, str(e)), (409, "already_exists", "sandbox x exists"))
        self.assertIsInstance(dsec._error(429, b'{"error":"quota","code":"resource_exhausted"}'), dsec.QuotaExceeded)
        self.assertIsInstance(dsec._error(401, b'{"error":"no","code":"unauthenticated"}'), dsec.Unauthorized)

    def test_status_fallback(self):
        e = dsec._error(404, b"404 page not found\n", "GET /v1/x")
        self.assertIsInstance(e, dsec.NotFound)
        self.assertIsInstance(e, LookupError)
        self.assertIn("404 page not found", str(e))
        self.assertIs(type(dsec._error(418, b"")), dsec.DsecError)
        self.assertIsInstance(dsec._frame_error({"error": "gone", "code": "not_found"}), dsec.NotFound)


if __name__ == "__main__":
    unittest.main()
