"""The data-path worker process of one lease: ``python -m gpuctl.datapath.worker ...``.

Started by gpuctld through :func:`gpuctl.datapath.launcher.start_worker`. Lifecycle:

* stdin is the control pipe from its parent. Its first line is the lease token in hex (the token is
  never in argv or the environment). Later lines: ``expires <unix seconds>`` moves the deadline
  (lease extended by a heartbeat), ``stop`` ends the worker. EOF (the parent died or closed the
  pipe) ends the worker.
* It listens on ``--bind``:``--port`` (0: any free port) and prints ``ready HOST:PORT`` on stdout once
  bound (errors before that go to stderr with exit status 2).
* It exits by itself at ``--expires-at-s`` (Unix seconds): it never outlives its lease.
* Every second it writes ``stats.json`` in ``--run-dir`` (LeaseAccounting.snapshot plus lease id,
  pid, endpoint, state), atomically; the last write says why it ended ("expired", "stopped",
  "parent_gone").

Each connection is served on its own thread with its own handle table; a broken connection gets an
ERROR frame (when the socket still works) and is closed, and the others go on.
"""

from __future__ import annotations

import argparse
import hmac
import os
import socket
import ssl
import sys
import threading
import time
import warnings
from typing import Any

from gpuctl.datapath.accounting import LeaseAccounting, write_stats_file
from gpuctl.datapath.protocol import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    ConnectionLost,
    FrameReader,
    FrameType,
    Limits,
    ProtocolError,
    check_hello,
    send_frame,
    tune_socket,
)
from gpuctl.datapath.session import Session, log, peer_log

#: Limits before the handshake: an unauthenticated peer can make the worker allocate almost nothing.
PREAUTH_LIMITS = Limits(max_meta_bytes=4096, max_payload_bytes=DEFAULT_LIMITS.max_token_bytes)
#: Time a connection has to complete the whole handshake (TLS, then HELLO), not per read: a peer
#: that sends one byte every few seconds is cut at this deadline all the same.
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections still in their handshake at once; past it the oldest one is cut, so connections that
#: never authenticate cannot keep the lease's client out (authenticated ones have their own limit).
MAX_PENDING_HANDSHAKES = 64


def make_executor(kind: str, quota_bytes: int, compute_share: float) -> Any:
    """The executor named `kind` ("numpy" or "cupy"). Raises ValueError for another name."""
    if kind == "numpy":
        from gpuctl.datapath.executor_numpy import NumpyExecutor

        return NumpyExecutor(quota_bytes, compute_share)
    if kind == "cupy":
        from gpuctl.datapath.executor_cupy import CupyExecutor

        return CupyExecutor(quota_bytes, compute_share)
    raise ValueError(f"--executor: {kind!r} is not one of numpy, cupy")


class Worker:
    """The worker's state: listening socket, lease deadline, accounting, connections."""

    def __init__(self, args: argparse.Namespace, token: bytes):
        self.args = args
        self.lease_id: str = args.lease_id
        self.token = token
        self.expires_at_s: float = args.expires_at_s
        self.executor = make_executor(args.executor, args.quota_bytes, args.compute_share)
        self.acct = LeaseAccounting(args.quota_bytes, self._root)
        self.torch_executor: Any = None  # made at the first gpuctl.torch connection
        self._torch_lock = threading.Lock()
        self.limits = DEFAULT_LIMITS
        self.state = "serving"
        self.endpoint = ""
        self.ssl_ctx: ssl.SSLContext | None = None
        if args.tls_cert:
            self.ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ssl_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            self.ssl_ctx.load_cert_chain(args.tls_cert, args.tls_key)
        self._lock = threading.Lock()
        self.handshake_timeout_s: float = getattr(args, "handshake_timeout_s", HANDSHAKE_TIMEOUT_S)
        #: sockets still in their handshake -> deadline (time.monotonic seconds), oldest first
        self._pending: dict[socket.socket, float] = {}

    def _root(self, arr: Any) -> tuple[Any, int]:
        """The memory root of an array of either executor (torch tensors have storages)."""
        if hasattr(arr, "untyped_storage"):
            s = arr.untyped_storage()
            return s, s.nbytes()
        return self.executor.root(arr)

    def session_for(self, sock: socket.socket, hello: dict[str, Any], reader: FrameReader) -> Session:
        """The session serving a connection: torch (HELLO ``"executor": "torch"``; CUDA torch where
        the worker runs CuPy, CPU torch on simulated nodes) or the worker's array executor.
        Raises ProtocolError("executor") for another executor name or when torch is missing."""
        info = {"lease_id": self.lease_id, "executor": self.executor.name}
        wanted = hello.get("executor", self.executor.name)
        if wanted == "torch":
            with self._torch_lock:  # not self._lock: starting torch (and CUDA) takes seconds
                if self.torch_executor is None:
                    from gpuctl.datapath.executor_torch import TorchExecutor

                    try:
                        self.torch_executor = TorchExecutor(self.acct.quota_bytes, self.executor.compute_share,
                                                            "cuda" if self.executor.name == "cupy" else "cpu")
                    except ImportError as e:
                        raise ProtocolError(f"this node cannot run gpuctl.torch: {e}", "executor") from None
            from gpuctl.datapath.executor_torch import TorchSession

            info["executor"] = "torch"
            return TorchSession(sock, self.torch_executor, self.acct, self.limits, info, reader)
        if wanted != self.executor.name:
            raise ProtocolError(f"hello.executor: {str(wanted)[:40]!r} is not served here (torch or "
                                f"{self.executor.name})", "executor")
        return Session(sock, self.executor, self.acct, self.limits, info, reader)

    # -- lifecycle -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        snap = self.acct.snapshot()
        snap.update(lease_id=self.lease_id, pid=os.getpid(), endpoint=self.endpoint, state=self.state,
                    executor=self.executor.name, expires_at_s=self.expires_at_s, updated_s=time.time())
        return snap

    def write_stats(self) -> None:
        if self.args.run_dir:
            try:
                write_stats_file(os.path.join(self.args.run_dir, "stats.json"), self.stats())
            except OSError as e:
                log(f"cannot write stats to {self.args.run_dir}: {e}")

    def end(self, state: str, code: int = 0) -> None:
        """Record why the worker ends and exit at once (threads serving clients die with it)."""
        self.state = state
        self.write_stats()
        log(f"lease {self.lease_id}: {state}, exiting")
        os._exit(code)

    def watchdog(self) -> None:
        """Ends the worker at the lease's expiry; writes stats.json every second."""
        last = 0.0
        while True:
            now = time.time()
            if now >= self.expires_at_s:
                self.end("expired")
            if now - last >= 1.0:
                self.write_stats()
                last = now
            self.cut_late_handshakes()
            time.sleep(min(0.1, max(0.0, self.expires_at_s - now)))

    def control(self) -> None:
        """Reads the parent's control pipe (stdin) until EOF; EOF ends the worker."""
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "expires" and len(words) == 2:
                try:
                    self.expires_at_s = float(words[1])
                except ValueError:
                    log(f"control: bad deadline {words[1]!r} ignored")
            elif words[0] == "stop":
                self.end("stopped")
            else:
                log(f"control: unknown command {words[0]!r} ignored")
        self.end("parent_gone")

    # -- connections ---------------------------------------------------------------------------
    def cut_late_handshakes(self) -> None:
        """Shut down the connections whose handshake passed its deadline (their thread then sees
        the connection closed and ends)."""
        now = time.monotonic()
        with self._lock:
            late = [s for s, deadline in self._pending.items() if deadline <= now]
            for s in late:
                del self._pending[s]
        for s in late:
            _shut(s)

    def _add_pending(self, sock: socket.socket) -> None:
        with self._lock:
            oldest = None
            if len(self._pending) >= MAX_PENDING_HANDSHAKES:
                oldest = next(iter(self._pending))
                del self._pending[oldest]
            self._pending[sock] = time.monotonic() + self.handshake_timeout_s
        if oldest is not None:
            _shut(oldest)

    def _done_pending(self, sock: socket.socket) -> bool:
        """Take `sock` off the pending list; False when it was already cut (deadline or eviction)."""
        with self._lock:
            return self._pending.pop(sock, None) is not None

    def handshake(self, sock: socket.socket, reader: FrameReader) -> dict[str, Any]:
        """Read and check the HELLO (version, token, lease id, expiry) and return its metadata;
        raises ProtocolError."""
        sock.settimeout(self.handshake_timeout_s)
        hdr = reader.header(PREAUTH_LIMITS)
        if hdr.ftype != FrameType.HELLO:
            raise ProtocolError(f"expected HELLO, got {hdr.ftype.name}", "handshake")
        meta = reader.meta(hdr)
        token = bytearray(hdr.payload_len)
        reader.read_into(memoryview(token), "hello token")
        check_hello(meta, bytes(token), self.lease_id, self.token, hmac.compare_digest)
        if time.time() >= self.expires_at_s:
            raise ProtocolError(f"lease {self.lease_id} has expired", "expired")
        return meta

    def welcome(self, sock: socket.socket, session: Session) -> None:
        send_frame(sock, FrameType.WELCOME, {
            "protocol": PROTOCOL_VERSION, "lease_id": self.lease_id, "executor": session.info["executor"],
            "quota_bytes": self.acct.quota_bytes, "compute_share": self.executor.compute_share,
            "expires_at_s": self.expires_at_s, "limits": self.limits.to_json(),
        })
        sock.settimeout(None)

    def serve_connection(self, sock: socket.socket, peer: Any) -> None:
        """Handshake (within the deadline), then serve the session until the client leaves. Only
        authenticated connections count against ``--max-connections``."""
        session = None
        raw = sock
        counted = False
        try:
            if self.ssl_ctx is not None:
                sock.settimeout(self.handshake_timeout_s)
                sock = self.ssl_ctx.wrap_socket(sock, server_side=True)
            reader = FrameReader(sock)
            hello = self.handshake(sock, reader)
            if not self._done_pending(raw):
                raise ConnectionLost(f"handshake not completed within {self.handshake_timeout_s:g} s")
            with self._lock:
                if self.acct.connections >= self.args.max_connections:
                    raise ProtocolError(
                        f"worker of lease {self.lease_id} has {self.args.max_connections} connections", "busy")
                self.acct.connections += 1
                self.acct.connections_total += 1
                counted = True
            session = self.session_for(sock, hello, reader)
            self.welcome(sock, session)
            session.serve()
        except ConnectionLost as e:
            peer_log(f"{peer}: {e}")
        except ProtocolError as e:
            peer_log(f"{peer}: refused: {e}")
            try:
                send_frame(sock, FrameType.ERROR, {"code": e.code, "message": str(e)})
            except (ProtocolError, OSError):
                pass
        except (OSError, ssl.SSLError) as e:
            peer_log(f"{peer}: {e}")
        except Exception as e:  # noqa: BLE001 - a fault of ours: the client gets ERROR, others go on
            peer_log(f"{peer}: internal error: {type(e).__name__}: {e}")
            try:
                send_frame(sock, FrameType.ERROR, {"code": "internal",
                                                   "message": f"internal error: {type(e).__name__}: {e}"})
            except (ProtocolError, OSError):
                pass
        finally:
            self._done_pending(raw)
            if session is not None:
                session.close()
            if counted:
                with self._lock:
                    self.acct.connections -= 1
            try:
                sock.close()
            except OSError:
                pass

    def run(self) -> None:
        family = socket.AF_INET6 if ":" in self.args.bind else socket.AF_INET
        srv = socket.socket(family, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.args.bind, self.args.port))
        srv.listen(64)
        host, port = srv.getsockname()[:2]
        self.endpoint = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        threading.Thread(target=self.watchdog, name="watchdog", daemon=True).start()
        threading.Thread(target=self.control, name="control", daemon=True).start()
        print(f"ready {self.endpoint}", flush=True)
        log(f"lease {self.lease_id}: serving on {self.endpoint} ({self.executor.name}, "
            f"quota {self.acct.quota_bytes} bytes)")
        while True:
            conn, peer = srv.accept()
            tune_socket(conn)
            self._add_pending(conn)
            threading.Thread(target=self.serve_connection, args=(conn, peer), daemon=True).start()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpuctl.datapath.worker",
                                description="data-path worker of one lease (token on stdin)")
    p.add_argument("--lease-id", required=True)
    p.add_argument("--executor", choices=("numpy", "cupy"), required=True)
    p.add_argument("--quota-bytes", type=int, required=True)
    p.add_argument("--compute-share", type=float, default=1.0)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--expires-at-s", type=float, required=True)
    p.add_argument("--run-dir", default=None)
    p.add_argument("--tls-cert", default=None)
    p.add_argument("--tls-key", default=None)
    p.add_argument("--max-connections", type=int, default=32, help="authenticated connections at once")
    p.add_argument("--handshake-timeout-s", type=float, default=HANDSHAKE_TIMEOUT_S,
                   help="seconds a connection has to complete its handshake (default %(default)s)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.simplefilter("ignore")  # NumPy's divide/overflow warnings: CuPy gives none either
    line = sys.stdin.readline().strip()
    try:
        token = bytes.fromhex(line)
    except ValueError:
        token = b""
    if not token:
        print("gpuctl-worker: stdin: first line must be the lease token in hex", file=sys.stderr)
        sys.exit(2)
    if args.quota_bytes <= 0:
        print(f"gpuctl-worker: --quota-bytes must be > 0, got {args.quota_bytes}", file=sys.stderr)
        sys.exit(2)
    if time.time() >= args.expires_at_s:
        print(f"gpuctl-worker: lease {args.lease_id} already expired", file=sys.stderr)
        sys.exit(2)
    try:
        worker = Worker(args, token)
        worker.run()
    except (OSError, ValueError, ImportError) as e:
        print(f"gpuctl-worker: lease {args.lease_id}: {e}", file=sys.stderr, flush=True)
        os._exit(2)


def _shut(sock: socket.socket) -> None:
    """Shut a connection down both ways (its serving thread's blocked read returns at once)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


if __name__ == "__main__":
    main()
