"""Python client for dsec's native HTTP API (stdlib only, Python 3.9+).

Shaped for RL rollout code::

    import dsec

    client = dsec.Client()                      # DSEC_ADDR / DSEC_TOKEN, else the local socket
    with client.sandbox(image="python:3.12", cpu=1, memory="512Mi",
                        network={"pypi": True}) as sb:
        sb.files.write("/work/main.py", "print(6 * 7)")
        r = sb.exec(["python", "main.py"], cwd="/work", timeout=30)
        assert r.exit_code == 0 and r.stdout == "42\\n"

Sizes accept ints (bytes) or strings such as "512Mi", "1G"; durations accept
seconds (int or float) or datetime.timedelta and travel as nanoseconds.
Errors raise DsecError subclasses chosen by the server's error code.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import io
import ipaddress
import json
import math
import os
import re
import select
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

__all__ = [
    "Client", "Sandbox", "Files", "ExecResult", "DsecError", "InvalidArgument", "Unauthorized",
    "PermissionDenied", "NotFound", "AlreadyExists", "FailedPrecondition", "QuotaExceeded",
    "Unimplemented", "Unavailable", "DeadlineExceeded", "parse_size", "to_nanoseconds", "parse_rule",
    "network_policy", "DEFAULT_ADDR",
]

DEFAULT_ADDR = "unix:///run/dsec/dsec.sock"


# ---------------------------------------------------------------- errors

class DsecError(Exception):
    """A failure reported by the server (or reaching it)."""

    def __init__(self, message: str, status: int = 0, code: str = ""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class InvalidArgument(DsecError, ValueError):
    """400: the request was malformed (bad size, bad path, ...)."""


class Unauthorized(DsecError):
    """401: missing, unknown or revoked token."""


class PermissionDenied(DsecError):
    """403: the token's tenant may not do this."""


class NotFound(DsecError, LookupError):
    """404: no such sandbox, image, exec, file or tenant (or not yours)."""


class AlreadyExists(DsecError):
    """409 already_exists."""


class FailedPrecondition(DsecError):
    """409: not possible in the current state (e.g. exec in a paused sandbox)."""


class QuotaExceeded(DsecError):
    """429: tenant quota or node capacity exhausted."""


class Unimplemented(DsecError):
    """501: the server does not support this."""


class Unavailable(DsecError, ConnectionError):
    """503, or the server could not be reached."""


class DeadlineExceeded(DsecError, TimeoutError):
    """504: the server gave up waiting."""


_CODE_CLASS = {
    "invalid_argument": InvalidArgument,
    "unauthenticated": Unauthorized,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "already_exists": AlreadyExists,
    "failed_precondition": FailedPrecondition,
    "resource_exhausted": QuotaExceeded,
    "not_implemented": Unimplemented,
    "unavailable": Unavailable,
    "deadline_exceeded": DeadlineExceeded,
}

_STATUS_CLASS = {
    400: InvalidArgument, 401: Unauthorized, 403: PermissionDenied, 404: NotFound,
    409: FailedPrecondition, 429: QuotaExceeded, 501: Unimplemented, 502: Unavailable,
    503: Unavailable, 504: DeadlineExceeded,
}


def _error(status: int, body: bytes, what: str = "") -> DsecError:
    code, msg = "", ""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
        if isinstance(doc, dict):
            code, msg = str(doc.get("code") or ""), str(doc.get("error") or "")
    except ValueError:
        pass
    if not msg:
        text = body.decode("utf-8", "replace").strip().splitlines()
        msg = (text[0][:200] if text else "") or http.client.responses.get(status, "error")
        msg = "%s (HTTP %d%s)" % (msg, status, " " + what if what else "")
    cls = _CODE_CLASS.get(code) or _STATUS_CLASS.get(status, DsecError)
    return cls(msg, status=status, code=code)


def _frame_error(frame: dict) -> DsecError:
    code = str(frame.get("code") or "")
    cls = _CODE_CLASS.get(code, DsecError)
    return cls(str(frame.get("error") or code or "stream error"), status=0, code=code)


# ---------------------------------------------------------------- units

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(Ki|Mi|Gi|Ti|K|k|M|G|T)?B?\s*$")
_SIZE_MULT = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
              "K": 10**3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(v: Union[int, str, None]) -> int:
    """Bytes from an int or a string such as "512Mi", "1G", "1.5Gi"."""
    if v is None:
        return 0
    if isinstance(v, bool):
        raise InvalidArgument("size must be a number or a string like '512Mi', got %r" % (v,))
    if isinstance(v, int):
        if v < 0:
            raise InvalidArgument("size must not be negative, got %d" % v)
        return v
    if isinstance(v, float):
        if v < 0 or v != int(v):
            raise InvalidArgument("size must be a whole, non-negative number of bytes, got %r" % v)
        return int(v)
    if not isinstance(v, str):
        raise InvalidArgument("size must be an int or a string like '512Mi', got %r" % (v,))
    m = _SIZE_RE.match(v)
    if not m:
        raise InvalidArgument("invalid size %r: want a number with an optional Ki/Mi/Gi/Ti or K/M/G/T suffix" % v)
    b = float(m.group(1)) * _SIZE_MULT[m.group(2)]
    if b != int(b):
        raise InvalidArgument("invalid size %r: not a whole number of bytes" % v)
    if b > 2**62:
        raise InvalidArgument("invalid size %r: too large" % v)
    return int(b)


def to_nanoseconds(v: Union[int, float, datetime.timedelta, None]) -> int:
    """Wire nanoseconds from seconds (int/float) or a timedelta."""
    if v is None:
        return 0
    if isinstance(v, datetime.timedelta):
        v = v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidArgument("duration must be seconds (int or float) or a timedelta, got %r" % (v,))
    if math.isnan(v) or math.isinf(v) or v < 0:
        raise InvalidArgument("duration must be a finite, non-negative number of seconds, got %r" % (v,))
    return int(round(v * 1e9))


_PRESET_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def parse_rule(s: str) -> Dict[str, str]:
    """One egress rule: "preset:NAME" or "CIDR[:PORTS][/tcp|udp]" (IPv6 in
    brackets when ports are given: "[2001:db8::/32]:443")."""
    if not isinstance(s, str):
        raise InvalidArgument("rule must be a string, got %r" % (s,))
    raw = s.strip()
    if raw.startswith("preset:"):
        name = raw[len("preset:"):]
        if not _PRESET_RE.match(name):
            raise InvalidArgument("invalid rule %r: bad preset name" % s)
        return {"preset": name}
    rule: Dict[str, str] = {}
    head, sep, proto = raw.rpartition("/")
    if sep and proto.lower() in ("tcp", "udp"):
        rule["protocol"], raw = proto.lower(), head
    addr, ports = raw, None
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise InvalidArgument("invalid rule %r: unclosed '['" % s)
        addr, rest = raw[1:end], raw[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise InvalidArgument("invalid rule %r: expected ':' after ']'" % s)
            ports = rest[1:]
    elif raw.count(":") == 1:
        addr, ports = raw.split(":")
    try:
        if "/" in addr:
            ipaddress.ip_network(addr, strict=True)
        else:
            ipaddress.ip_address(addr)
    except ValueError as e:
        raise InvalidArgument("invalid rule %r: %s (want CIDR[:PORTS][/tcp|udp] or preset:NAME)" % (s, e)) from None
    rule["cidr"] = addr
    if ports is not None:
        lo, _, hi = ports.partition("-")
        try:
            a = int(lo)
            b = int(hi) if hi else a
        except ValueError:
            raise InvalidArgument("invalid rule %r: ports must be N or N-M" % s) from None
        if not (1 <= a <= 65535 and 1 <= b <= 65535 and a <= b):
            raise InvalidArgument("invalid rule %r: ports must be within 1-65535 and ascending" % s)
        rule["ports"] = ports
    return rule


def _rules(rules: Optional[Iterable[Union[str, dict]]]) -> List[dict]:
    out = []
    for r in rules or []:
        if isinstance(r, dict):
            bad = set(r) - {"cidr", "ports", "protocol", "preset"}
            if bad:
                raise InvalidArgument("unknown rule fields %s" % sorted(bad))
            out.append(dict(r))
        else:
            out.append(parse_rule(r))
    return out


def network_policy(network: Optional[dict]) -> dict:
    """Wire NetworkPolicy from {"pypi": True, "allow": [...], "deny": [...]}:
    keys other than allow/deny name presets to enable."""
    if network is None:
        return {}
    if not isinstance(network, dict):
        raise InvalidArgument("network must be a dict like {'pypi': True, 'allow': ['10.0.0.0/8:443']}")
    allow = _rules(network.get("allow"))
    deny = _rules(network.get("deny"))
    for r in deny:
        if "preset" in r:
            raise InvalidArgument("deny rules take CIDRs, not presets")
    for key, on in network.items():
        if key in ("allow", "deny"):
            continue
        if not _PRESET_RE.match(key):
            raise InvalidArgument("unknown network preset %r" % key)
        if on:
            allow.append({"preset": key})
    pol: Dict[str, Any] = {}
    if allow:
        pol["allow"] = allow
    if deny:
        pol["deny"] = deny
    return pol


def _env_list(env: Union[None, Dict[str, str], List[str]]) -> List[str]:
    if env is None:
        return []
    if isinstance(env, dict):
        items = ["%s=%s" % (k, v) for k, v in env.items()]
    else:
        items = list(env)
    for e in items:
        k, sep, _ = e.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]*$", k):
            raise InvalidArgument("invalid environment entry %r: want KEY=VALUE" % e)
    return items


# ---------------------------------------------------------------- transport

class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("dsec", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class ExecResult:
    """How a process ended, with its output."""

    def __init__(self, wire: dict, stdout: bytes = b"", stderr: bytes = b""):
        self.raw = wire
        self.exec_id: str = wire.get("exec_id", "")
        self.pid: int = wire.get("pid", 0)
        self.exit_code: int = wire.get("exit_code", 0)
        self.signal: str = wire.get("signal", "") or ""
        self.timed_out: bool = bool(wire.get("timed_out", False))
        self.stdout_truncated: bool = bool(wire.get("stdout_truncated", False))
        self.stderr_truncated: bool = bool(wire.get("stderr_truncated", False))
        self.duration: float = wire.get("duration_ns", 0) / 1e9
        self.output_bytes: int = wire.get("output_bytes", 0)
        self.stdout_bytes = stdout
        self.stderr_bytes = stderr

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.signal and not self.timed_out

    def __repr__(self) -> str:
        return "ExecResult(exit_code=%d, signal=%r, timed_out=%r, stdout=%d bytes, stderr=%d bytes)" % (
            self.exit_code, self.signal, self.timed_out, len(self.stdout_bytes), len(self.stderr_bytes))


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Client:
    """Talks to one dsec server.

    addr: "unix:///run/dsec/dsec.sock", "tcp://host:port", "http://host:port"
    or "https://host:port"; default $DSEC_ADDR, then the local socket.
    token: bearer token; default $DSEC_TOKEN. timeout: socket timeout in
    seconds for ordinary calls (execs wait as long as the process runs).
    Safe to share between threads (each call opens its own connection).
    """

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None, timeout: float = 600.0):
        addr = addr or os.environ.get("DSEC_ADDR") or DEFAULT_ADDR
        self.token = token if token is not None else os.environ.get("DSEC_TOKEN", "")
        self.timeout = timeout
        u = urllib.parse.urlsplit(addr)
        self._unix: Optional[str] = None
        self._tls = False
        if u.scheme == "unix":
            path = (u.netloc + u.path) if u.netloc else u.path
            if not path:
                raise InvalidArgument("bad address %r: no socket path" % addr)
            self._unix = path
        elif u.scheme in ("tcp", "http", "https"):
            if not u.hostname:
                raise InvalidArgument("bad address %r: no host" % addr)
            self._host, self._port = u.hostname, u.port
            self._tls = u.scheme == "https"
        else:
            raise InvalidArgument("bad address %r: want unix:///path, tcp://host:port or http(s)://host:port" % addr)
        self.addr = addr

    # -- plumbing

    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._unix:
            return _UnixHTTPConnection(self._unix, timeout)
        if self._tls:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _socket(self, timeout: Optional[float]) -> socket.socket:
        """A connected socket to the server (TLS for https)."""
        if self._unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(self._unix)
            except OSError:
                s.close()
                raise
            return s
        port = self._port or (443 if self._tls else 80)
        s = socket.create_connection((self._host, port), timeout=timeout)
        if self._tls:
            s = ssl.create_default_context().wrap_socket(s, server_hostname=self._host)
        return s

    def _head(self, method: str, path: str, headers: dict) -> bytes:
        host = "dsec" if self._unix else (self._host if not self._port else "%s:%d" % (self._host, self._port))
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: " + host]
        lines += ["%s: %s" % kv for kv in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _headers(self, extra: Optional[dict] = None) -> dict:
        h = {"User-Agent": "dsec-python", "Accept": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if extra:
            h.update(extra)
        return h

    @staticmethod
    def _url(path: str, query: Optional[Dict[str, Any]]) -> str:
        if not query:
            return path
        pairs = []
        for k, v in query.items():
            if isinstance(v, (list, tuple)):
                pairs.extend((k, str(x)) for x in v)
            elif v is not None:
                pairs.append((k, str(v)))
        return path + ("?" + urllib.parse.urlencode(pairs) if pairs else "")

    def _open(self, method: str, path: str, query=None, body=None, headers=None, timeout="default"):
        """Send a request and return (conn, response) for a 2xx reply."""
        t = self.timeout if timeout == "default" else timeout
        conn = self._conn(t)
        try:
            conn.request(method, self._url(path, query), body=body, headers=self._headers(headers))
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise Unavailable("cannot reach dsec server at %s: %s" % (self.addr, e)) from e
        if resp.status // 100 != 2:
            data = resp.read()
            conn.close()
            raise _error(resp.status, data, "%s %s" % (method, path))
        return conn, resp

    def _call(self, method: str, path: str, query=None, body: Any = None) -> Any:
        data, headers = None, {}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn, resp = self._open(method, path, query, data, headers)
        try:
            raw = resp.read()
        finally:
            conn.close()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise DsecError("bad JSON reply to %s %s: %s" % (method, path, e)) from e

    # -- sandboxes

    def create(self, image: str, *, cpu: Optional[float] = None, cpu_limit: Optional[float] = None,
               memory: Union[int, str, None] = None, disk: Union[int, str, None] = None,
               pids: Optional[int] = None, idle_ttl=None, max_lifetime=None, on_idle: Optional[str] = None,
               network: Optional[dict] = None, labels: Optional[Dict[str, str]] = None,
               env: Union[None, Dict[str, str], List[str]] = None, qos: Optional[str] = None,
               allow_userns: bool = False) -> "Sandbox":
        """Create a sandbox; returns once it is ready."""
        if not image:
            raise InvalidArgument("image is required")
        if on_idle not in (None, "delete", "pause"):
            raise InvalidArgument("on_idle must be 'delete' or 'pause', got %r" % on_idle)
        if qos not in (None, "latency", "standard", "batch"):
            raise InvalidArgument("qos must be latency, standard or batch, got %r" % qos)
        for name, v in (("cpu", cpu), ("cpu_limit", cpu_limit), ("pids", pids)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise InvalidArgument("%s must be a non-negative number, got %r" % (name, v))
        spec = {
            "id": "", "tenant": "", "image": image,
            "cpu": float(cpu or 0), "cpu_limit": float(cpu_limit or 0),
            "memory_bytes": parse_size(memory), "pids": int(pids or 0), "disk_bytes": parse_size(disk),
            "idle_ttl": to_nanoseconds(idle_ttl), "max_lifetime": to_nanoseconds(max_lifetime),
            "on_idle": on_idle or "", "env": _env_list(env), "labels": dict(labels or {}),
            "network": network_policy(network), "qos": qos or "", "allow_userns": bool(allow_userns),
        }
        for k, v in spec["labels"].items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k:
                raise InvalidArgument("labels must map non-empty string keys (without '=') to strings")
        return Sandbox(self, self._call("POST", "/v1/sandboxes", body=spec))

    @contextlib.contextmanager
    def sandbox(self, image: str, **kwargs) -> Iterator["Sandbox"]:
        """Create a sandbox for a with-block; it is deleted on exit, also
        when the block raises."""
        sb = self.create(image, **kwargs)
        try:
            yield sb
        finally:
            sb.delete(missing_ok=True)

    def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self, self._call("GET", "/v1/sandboxes/" + _q(_need(sandbox_id, "sandbox id"))))

    def list(self, labels: Optional[Dict[str, str]] = None, state: Optional[str] = None) -> List["Sandbox"]:
        q = {"label": ["%s=%s" % kv for kv in sorted((labels or {}).items())], "state": state}
        return [Sandbox(self, d) for d in self._call("GET", "/v1/sandboxes", q) or []]

    # -- images

    def images(self) -> List[dict]:
        return self._call("GET", "/v1/images") or []

    def image(self, ref: str) -> dict:
        return self._call("GET", "/v1/images/" + _q(_need(ref, "image ref")))

    def remove_image(self, ref: str) -> None:
        self._call("DELETE", "/v1/images/" + _q(_need(ref, "image ref")))

    def gc_images(self) -> dict:
        return self._call("POST", "/v1/images/gc")

    def image_stats(self, ref: str) -> dict:
        return self._call("GET", "/v1/images/" + _q(_need(ref, "image ref")) + "/stats")

    def import_image(self, ref: str, *, path: Optional[str] = None, data=None, public: bool = False,
                     progress=None) -> dict:
        """Import an image: path= a path on the server's host (admin), or
        data= bytes or a binary file object holding a tar. progress(dict)
        is called with each progress frame."""
        _need(ref, "image ref")
        if (path is None) == (data is None):
            raise InvalidArgument("give exactly one of path= (server-side) or data= (tar bytes or file)")
        q: Dict[str, Any] = {"ref": ref}
        if public:
            q["public"] = "true"
        headers = {"Accept": "application/x-ndjson"}
        if path is not None:
            if not os.path.isabs(path):
                raise InvalidArgument("server-side path %r must be absolute" % path)
            q["path"] = path
            body = None
        else:
            body = data  # a file object is sent chunked by http.client
            headers["Content-Type"] = "application/x-tar"
        conn, resp = self._open("POST", "/v1/images/import", q, body, headers)
        try:
            for frame in _ndjson(resp):
                if "image" in frame:
                    return frame["image"]
                if "error" in frame or "code" in frame:
                    raise _frame_error(frame)
                if progress is not None:
                    progress(frame)
        finally:
            conn.close()
        raise Unavailable("import of %s: stream ended without a result" % ref)

    # -- tenants, tokens, nodes

    def create_tenant(self, name: str, *, sandboxes: int = 0, cpu: float = 0, memory=None, disk=None) -> dict:
        return self._call("POST", "/v1/tenants", body={
            "name": _need(name, "tenant name"), "quota": {
                "sandboxes": int(sandboxes), "cpu": float(cpu),
                "memory_bytes": parse_size(memory), "disk_bytes": parse_size(disk)}})

    def tenants(self) -> List[dict]:
        return self._call("GET", "/v1/tenants") or []

    def delete_tenant(self, name: str) -> None:
        self._call("DELETE", "/v1/tenants/" + _q(_need(name, "tenant name")))

    def create_token(self, tenant: str, e2b: bool = False) -> dict:
        body: Dict[str, Any] = {"tenant": _need(tenant, "tenant name")}
        if e2b:
            body["e2b"] = True
        return self._call("POST", "/v1/tokens", body=body)

    def revoke_token(self, token_id: str) -> None:
        self._call("DELETE", "/v1/tokens/" + _q(_need(token_id, "token id")))

    def nodes(self) -> List[dict]:
        return self._call("GET", "/v1/nodes") or []

    def capacity(self, cpu: float = 1, memory="512Mi", disk=None, pids: int = 0) -> dict:
        return self._call("POST", "/v1/capacity", body={
            "cpu": float(cpu), "memory_bytes": parse_size(memory), "disk_bytes": parse_size(disk), "pids": int(pids)})

    def health(self) -> bool:
        """True when /healthz answers 2xx; raises Unavailable when unreachable."""
        conn, resp = self._open("GET", "/healthz", timeout=10)
        resp.read()
        conn.close()
        return True


def _need(v: str, what: str) -> str:
    if not v or not isinstance(v, str):
        raise InvalidArgument("%s must be a non-empty string" % what)
    return v


def _ndjson(resp) -> Iterator[dict]:
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except ValueError as e:
            raise DsecError("bad frame in stream: %s" % e) from e


def _check_path(p: str) -> str:
    if not isinstance(p, str) or not p.startswith("/"):
        raise InvalidArgument("sandbox path %r must be absolute" % (p,))
    return p


class Files:
    """File operations inside one sandbox (paths are absolute)."""

    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def _base(self) -> str:
        return "/v1/sandboxes/" + _q(self._sb.id) + "/files"

    def read(self, path: str) -> bytes:
        conn, resp = self._sb._client._open("GET", self._base(), {"path": _check_path(path)},
                                            headers={"Accept": "application/octet-stream"})
        try:
            return resp.read()
        finally:
            conn.close()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Union[bytes, str, Any], mode: int = 0o644) -> dict:
        """Create or replace a file with data (bytes, str or a binary file
        object, streamed). Parent directories must exist."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise InvalidArgument("mode must be an int permission like 0o644, got %r" % (mode,))
        headers = {"Content-Type": "application/octet-stream"}
        # A file object is sent chunked by http.client, without buffering.
        if not hasattr(data, "read") and not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes, str or a binary file object")
        q = {"path": _check_path(path), "mode": "%04o" % (mode or 0o644)}
        conn, resp = self._sb._client._open("PUT", self._base(), q, data, headers)
        try:
            return json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def list(self, path: str, depth: int = 1) -> List[dict]:
        if not isinstance(depth, int) or depth < 1:
            raise InvalidArgument("depth must be at least 1")
        return self._sb._client._call("GET", self._base() + "/list", {"path": _check_path(path), "depth": depth}) or []

    def stat(self, path: str) -> dict:
        return self._sb._client._call("GET", self._base() + "/stat", {"path": _check_path(path)})

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self._sb._client._call("POST", self._base() + "/mkdir", body={"path": _check_path(path), "mode": mode})

    def remove(self, path: str, recursive: bool = False) -> None:
        q = {"path": _check_path(path)}
        if recursive:
            q["recursive"] = "true"
        self._sb._client._call("DELETE", self._base(), q)

    def rename(self, src: str, dst: str) -> None:
        self._sb._client._call("POST", self._base() + "/rename", body={"from": _check_path(src), "to": _check_path(dst)})


class Sandbox:
    """One sandbox. `info` is the server's description at the last refresh."""

    def __init__(self, client: Client, info: dict):
        self._client = client
        self.info = info
        self.id: str = info["id"]
        self.files = Files(self)

    def __repr__(self) -> str:
        return "Sandbox(%s, %s)" % (self.id, self.info.get("state"))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.delete(missing_ok=True)

    @property
    def state(self) -> str:
        return self.info.get("state", "")

    @property
    def labels(self) -> Dict[str, str]:
        return (self.info.get("spec") or {}).get("labels") or {}

    def _path(self, rest: str = "") -> str:
        return "/v1/sandboxes/" + _q(self.id) + rest

    def refresh(self) -> "Sandbox":
        self.info = self._client._call("GET", self._path())
        return self

    def delete(self, missing_ok: bool = False) -> None:
        try:
            self._client._call("DELETE", self._path())
        except NotFound:
            if not missing_ok:
                raise

    def pause(self) -> None:
        self._client._call("POST", self._path("/pause"))

    def resume(self) -> None:
        self._client._call("POST", self._path("/resume"))

    def set_timeout(self, seconds: Union[int, float, datetime.timedelta]) -> None:
        """Expire the sandbox `seconds` from now (rounded up to whole seconds)."""
        ns = to_nanoseconds(seconds)
        if ns <= 0:
            raise InvalidArgument("timeout must be positive")
        self._client._call("POST", self._path("/timeout"), body={"timeout_seconds": int(math.ceil(ns / 1e9))})

    def stats(self) -> dict:
        return self._client._call("GET", self._path("/stats"))

    def set_network(self, network: Optional[dict]) -> None:
        self._client._call("PUT", self._path("/network"), body=network_policy(network or {}))

    def snapshot(self, image: str) -> dict:
        return self._client._call("POST", self._path("/snapshot"), body={"image": _need(image, "image ref")})

    def fork(self, count: int = 1) -> List["Sandbox"]:
        if not isinstance(count, int) or count < 1:
            raise InvalidArgument("count must be at least 1")
        return [Sandbox(self._client, d) for d in self._client._call("POST", self._path("/fork"), body={"count": count})]

    def execs(self) -> List[dict]:
        return self._client._call("GET", self._path("/execs")) or []

    def get_exec(self, exec_id: str) -> dict:
        return self._client._call("GET", self._path("/execs/" + _q(_need(exec_id, "exec id"))))

    def wait_exec(self, exec_id: str) -> ExecResult:
        return ExecResult(self._client._call("GET", self._path("/execs/" + _q(_need(exec_id, "exec id")) + "/wait")))

    def exec_output(self, exec_id: str, stream: str = "stdout") -> bytes:
        """The output the server kept of an exec's stream ("stdout" or
        "stderr"): the tail of at most its output cap, also after the call
        that started it went away, while the sandbox keeps it in its exec
        history."""
        if stream not in ("stdout", "stderr"):
            raise InvalidArgument("stream must be 'stdout' or 'stderr', got %r" % (stream,))
        conn, resp = self._client._open("GET", self._path("/execs/" + _q(_need(exec_id, "exec id")) + "/output"),
                                        {"stream": stream}, headers={"Accept": "application/octet-stream"})
        try:
            return resp.read()
        finally:
            conn.close()

    def signal_exec(self, exec_id: str, signal: int) -> None:
        if not isinstance(signal, int) or not 1 <= signal <= 64:
            raise InvalidArgument("signal must be 1..64")
        self._client._call("POST", self._path("/execs/" + _q(_need(exec_id, "exec id")) + "/signal"), body={"signal": signal})

    # -- exec

    def _exec_request(self, cmd, cwd, env, user, timeout, output_cap, tag) -> dict:
        req: Dict[str, Any] = {"sandbox_id": self.id}
        if isinstance(cmd, str):
            if not cmd:
                raise InvalidArgument("empty command")
            req["shell"] = cmd
        else:
            argv = list(cmd or [])
            if not argv or not all(isinstance(a, str) for a in argv):
                raise InvalidArgument("command must be a shell string or a non-empty list of strings")
            req["args"] = argv
        if env:
            req["env"] = _env_list(env)
        if cwd:
            req["cwd"] = cwd
        if user:
            req["user"] = str(user)
        if timeout is not None:
            req["timeout"] = to_nanoseconds(timeout)
        if output_cap is not None:
            req["output_cap"] = parse_size(output_cap)
        if tag:
            req["tag"] = tag
        return req

    def exec_stream(self, cmd: Union[str, List[str]], *, cwd: Optional[str] = None, env=None,
                    user: Optional[str] = None, timeout=None, stdin=None, output_cap=None,
                    tag: Optional[str] = None) -> Iterator[Union[Tuple[str, bytes], ExecResult]]:
        """Run cmd (a shell string, or an argv list) and yield
        ("stdout"|"stderr", bytes) chunks as they arrive, then the
        ExecResult as the last item. stdin: bytes, str, a binary file
        object or an iterable of bytes chunks, streamed while output
        arrives."""
        req = self._exec_request(cmd, cwd, env, user, timeout, output_cap, tag)
        line = json.dumps(req).encode() + b"\n"
        path = self._path("/exec")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        if isinstance(stdin, (bytes, bytearray)) and len(stdin) > (64 << 10):
            stdin = io.BytesIO(stdin)  # large: stream it so output is read meanwhile
        # The exec speaks HTTP/1.1 on a socket of its own rather than
        # through http.client's connection object: stdin must keep flowing
        # from a thread after the reply has started, and http.client drops
        # its socket as soon as a reply says "Connection: close".
        headers = self._client._headers({"Content-Type": "application/x-ndjson", "Accept": "application/x-ndjson"})
        feeder = None
        sock = None
        try:
            sock = self._client._socket(self._client.timeout)
            # Blocking from here on: the feeder thread writes while this
            # one reads, and a socket's timeout mode must not change under
            # a concurrent sendall. The wait for the reply is bounded below.
            sock.settimeout(None)
            if stdin is None or isinstance(stdin, (bytes, bytearray)):
                body = line + bytes(stdin or b"")
                headers["Content-Length"] = str(len(body))
                sock.sendall(self._client._head("POST", path, headers) + body)
            else:
                headers["Transfer-Encoding"] = "chunked"
                sock.sendall(self._client._head("POST", path, headers))
                feeder = _StdinFeeder(sock, line, stdin)
                feeder.start()
            if not select.select([sock], [], [], self._client.timeout)[0]:
                raise socket.timeout("no reply to POST %s within %ss" % (path, self._client.timeout))
            # Once it has started, output may pause for as long as the
            # process runs: no timeout on reading it.
            resp = http.client.HTTPResponse(sock, method="POST")
            resp.begin()
        except (OSError, http.client.HTTPException) as e:
            if feeder is not None:
                feeder.stop()
            if sock is not None:
                sock.close()
            raise Unavailable("cannot reach dsec server at %s: %s" % (self._client.addr, e)) from e
        try:
            if resp.status // 100 != 2:
                raise _error(resp.status, resp.read(), "POST " + path)
            out: List[bytes] = []
            err: List[bytes] = []
            for frame in _ndjson(resp):
                if "result" in frame:
                    yield ExecResult(frame["result"], b"".join(out), b"".join(err))
                    return
                if "error" in frame or "code" in frame:
                    raise _frame_error(frame)
                stream = frame.get("stream")
                if stream in ("stdout", "stderr"):
                    data = base64.b64decode(frame.get("data") or "")
                    (out if stream == "stdout" else err).append(data)
                    yield stream, data
            raise Unavailable("exec in %s: stream ended without a result (the process may still run)" % self.id)
        finally:
            if feeder is not None:
                feeder.stop()
            resp.close()
            sock.close()

    def exec(self, cmd: Union[str, List[str]], *, cwd: Optional[str] = None, env=None, user: Optional[str] = None,
             timeout=None, stdin=None, output_cap=None, tag: Optional[str] = None) -> ExecResult:
        """Run cmd to completion and return its result with the output. A
        non-zero exit is not an exception: check exit_code / ok."""
        res = None
        for item in self.exec_stream(cmd, cwd=cwd, env=env, user=user, timeout=timeout, stdin=stdin,
                                     output_cap=output_cap, tag=tag):
            if isinstance(item, ExecResult):
                res = item
        assert res is not None  # exec_stream raises when no result arrives
        return res


class _StdinFeeder(threading.Thread):
    """Writes the exec request line and then stdin as HTTP chunks."""

    def __init__(self, sock: socket.socket, line: bytes, stdin):
        super().__init__(daemon=True)
        self._sock, self._line, self._stdin = sock, line, stdin
        self._stopped = threading.Event()
        self.error: Optional[BaseException] = None

    def _chunks(self) -> Iterator[bytes]:
        yield self._line
        src = self._stdin
        if hasattr(src, "read"):
            while not self._stopped.is_set():
                b = src.read(64 << 10)
                if not b:
                    return
                yield b.encode() if isinstance(b, str) else b
        else:
            for b in src:
                if self._stopped.is_set():
                    return
                yield b.encode() if isinstance(b, str) else bytes(b)

    def run(self) -> None:
        try:
            for b in self._chunks():
                if b:
                    self._sock.sendall(b"%x\r\n%s\r\n" % (len(b), b))
            self._sock.sendall(b"0\r\n\r\n")
        except (OSError, ValueError) as e:  # the exec ended or the connection closed
            self.error = e

    def stop(self) -> None:
        self._stopped.set()
