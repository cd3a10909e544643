"""Provides the front's hub (the job's sockets, served by one thread) and `attach`'s Subscriber.

    ranks ── PUSH ─▶ PULL ─┬─▶ Collector, Liveness ─▶ LiveSource ─▶ the front's pipeline
                           └─▶ PUB ─▶ SUB (`ddptop attach`: Subscriber, its own Collector and Liveness)
    ctl, attach, rank 0's agent ── DEALER ─▶ ROUTER: request/reply, each request's role checked (RIGHTS)
    a joining rank (the join role: it knows the token) ── DEALER ─▶ ROUTER: its hello; rank 0 reads them, answers

The hub keeps what clients ask about, never more than a bound: rank 0's newest status, each rank's newest
heartbeat and last RECENT steps, the requests rank 0 has not taken yet (MAX_REQUESTS), the answers (MAX_ANSWERS,
oldest first out), the front's word on where it records and how the job ended, and the join: each rank's first hello (at most
world size, each under keys.MAX_HELLO_BYTES) and rank 0's verdict. Only a key derived from the token reaches them:
ZeroMQ's CURVE handshake and the ZAP handler (transport.py) refuse any other before a byte of it is read here. Requests go to rank 0 when its
agent syncs (every 0.25 s, every 50 ms while a request is under way: status and answers up, new
requests down); rank 0 checks each (commands.read_request).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

import zmq

from ddptop.control import keys, transport
from ddptop.control.auth import JobKeys
from ddptop.control.bus import Collector, LiveSource, Liveness, receive
from ddptop.control.commands import OPS
from ddptop.events import StepDone

RIGHTS = {"ctl": {"status", "request", "answer", "forget", "say"}, "attach": {"status"}, "agent": {"sync"},
          "join": {"hello", "joined", "judge", "verdict"}}
JOIN_OPS = RIGHTS["join"]
RECENT = keys.MAX_RECENT  # StepDone per rank kept for `ctl status`
MAX_REQUESTS = 64  # requests rank 0 has not taken: a client past that is refused (rank 0 gone or stuck)
MAX_ANSWERS = 4096
POLL_MS = 50


class Hub:
    """The front's sockets and what they received. `source` and `liveness` go into the front's pipeline."""

    def __init__(self, host: str, job: JobKeys, world_size: int, lost_after_s: float = 10.0, public=None):
        self.server = transport.Server(host, job)
        self.world_size = world_size
        self.collector = Collector(world_size)
        self.liveness = Liveness(world_size, lost_after_s, public=public, stats=self.stats)
        self.source = LiveSource(closer=self.drain)
        self.status: dict | None = None
        self.recent: dict[int, collections.deque] = {}
        self.requests: dict[int, dict] = {}
        self.answers: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.made = 0  # requests handed an id
        self.ended: dict | None = None
        self.recording: dict | None = None
        self.hellos: dict[int, dict] = {}  # the join: each rank's first hello
        self.verdict: dict | None = None  # rank 0's answer to them
        self.counts = {"bad_messages": 0, "dropped": 0}
        self.syncs = 0  # rank 0's agent's syncs answered: each wakes the front and rank 0's control thread
        self.listened = False  # someone subscribed to the republished stream (attach, ctl watch)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._drained = threading.Event()
        self._draining = False
        self._thread = threading.Thread(target=self._run, name="ddptop-hub", daemon=True)
        self._thread.start()

    def endpoints(self) -> dict:
        return self.server.endpoints()

    def stats(self) -> dict[str, int]:
        return {**self.counts, "refused_keys": self.server.auth.refused}

    # -- the thread ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # the context terminated under it, or a bug: said once by the feed, never silent
            self.source.error = (str(exc).splitlines() or [type(exc).__name__])[0]
            self._drained.set()
            for sock in self.server.sockets.values():
                sock.close(linger=0)

    def _loop(self) -> None:
        tel, ctl, pub = (self.server.sockets[n] for n in ("tel", "ctl", "pub"))
        poller = zmq.Poller()
        poller.register(ctl, zmq.POLLIN)
        poller.register(pub, zmq.POLLIN)  # (un)subscriptions: whether anyone listens
        reading = False
        while not self._halt.is_set():
            want = self.source.backlog < LiveSource.MAX_BACKLOG  # else ZeroMQ's marks hold the rest
            if want and not reading:
                poller.register(tel, zmq.POLLIN)
            elif reading and not want:
                poller.unregister(tel)
            reading = want
            ready = dict(poller.poll(POLL_MS))
            if ctl in ready:
                self._serve(ctl)
            if pub in ready:
                self._listeners(pub)
            if tel in ready:
                self._take(tel, pub)
            if self._draining and not tel.poll(0):
                self._drained.set()
        for sock in (tel, ctl, pub):
            sock.close(linger=0)

    def _take(self, tel: zmq.Socket, pub: zmq.Socket) -> None:
        """Up to 256 messages a turn, so requests are answered between them."""
        for _ in range(256):
            try:
                parts = tel.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            events = receive(parts, self.collector, self.liveness)
            if events is None:
                self.counts["bad_messages"] += 1
                continue
            if self.listened:  # nobody subscribed: nothing to copy (9% of the front's CPU at 512 ranks, issue 41)
                try:
                    pub.send_multipart(parts, zmq.NOBLOCK)  # a subscriber that falls behind sees a gap in seq
                except zmq.Again:
                    pass
            for e in events:
                if isinstance(e, StepDone):
                    self.recent.setdefault(e.rank, collections.deque(maxlen=RECENT)).append(e)  # encoded when asked
            self.source.inject(events)

    def _listeners(self, pub: zmq.Socket) -> None:
        """XPUB passes on the first subscription to a topic and the last unsubscription (every subscriber takes
        everything, topic b""): the newest of these says whether anyone listens now."""
        for _ in range(64):
            try:
                message = pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] in (b"\x00", b"\x01"):
                self.listened = message[:1] == b"\x01"

    def _serve(self, ctl: zmq.Socket) -> None:
        for _ in range(64):
            try:
                frames = ctl.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 4:
                self.counts["bad_messages"] += 1
                continue
            role = frames[-1].get("User-Id")
            who, request_id, op = frames[0].bytes, frames[1].bytes, frames[2].bytes.decode("ascii", "replace")
            try:
                body = json.loads(frames[3].bytes)
                if op not in RIGHTS.get(role, ()) or not isinstance(body, dict):
                    raise ValueError(f"{role} may not ask {op[:20]!r}")
                reply = self._answer(op, body)
            except (ValueError, TypeError, KeyError, RecursionError) as exc:
                self.counts["bad_messages"] += 1
                reply = {"error": str(exc)[:200] or "malformed"}
            try:
                ctl.send_multipart([who, request_id, json.dumps(reply).encode()], zmq.NOBLOCK)
            except zmq.Again:  # that client does not read: its next call has a fresh socket
                pass

    def _answer(self, op: str, body: dict) -> dict[str, Any]:
        with self._lock:
            if op in JOIN_OPS:
                return self._join(op, body)
            if op == "status":
                beats = {str(r): step for r, (_, step) in self.liveness.beats.items()}
                steps = {str(r): [e.to_dict() for e in d] for r, d in self.recent.items()} if body.get("steps") else {}
                return {"status": self.status, "beats": beats, "steps": steps, "ended": self.ended,
                        "recording": self.recording}
            if op == "request":
                if body.get("op") not in OPS:
                    raise ValueError("unknown op")
                if len(self.requests) >= MAX_REQUESTS:
                    raise ValueError(f"rank 0 has not taken the last {MAX_REQUESTS} requests: is it running?")
                self.made += 1
                self.requests[self.made] = {**body, "id": self.made}
                return {"id": self.made}
            request_id = body.get("id")
            if op in ("answer", "forget", "say") and not isinstance(request_id, int):
                raise ValueError("no request id")
            if op == "answer":
                return {"answer": self.answers.get(request_id), "ended": self.ended}
            if op == "forget":
                self.answers.pop(request_id, None)
                return {}
            if op == "say":
                self._keep(request_id, body.get("answer"))
                return {}
            return self._sync(body)

    def _sync(self, body: dict) -> dict[str, Any]:
        """Rank 0's agent: its status and answers in, the requests after `seen` out."""
        self.syncs += 1
        if isinstance(body.get("status"), dict):
            self.status = body["status"]
        for request_id, answer in body.get("answers") or []:
            self._keep(request_id, answer)
        seen = body.get("seen")
        seen = seen if isinstance(seen, int) else 0
        for request_id in [i for i in self.requests if i <= seen]:
            del self.requests[request_id]
        return {"requests": [self.requests[i] for i in sorted(self.requests)]}

    def _join(self, op: str, body: dict) -> dict[str, Any]:
        """A rank's hello (the first for its rank stays: the reply says whose it is), the ranks that joined (`all`:
        their hellos, for rank 0), rank 0's verdict (`judge`) and reading it."""
        if op == "hello":
            hello = body.get("hello")
            rank = hello.get("rank") if isinstance(hello, dict) else None
            if type(rank) is not int or not 0 <= rank < self.world_size:
                raise ValueError(f"a hello for no rank of this job (world size {self.world_size})")
            if len(json.dumps(hello)) > keys.MAX_HELLO_BYTES:
                raise ValueError(f"a hello over {keys.MAX_HELLO_BYTES} bytes")
            return {"hello": self.hellos.setdefault(rank, hello)}
        if op == "joined":
            if body.get("all"):
                return {"hellos": [self.hellos[r] for r in sorted(self.hellos)]}
            return {"ranks": sorted(self.hellos)}
        if op == "judge":
            if not isinstance(body.get("verdict"), dict):
                raise ValueError("malformed verdict")
            self.verdict = body["verdict"]
            return {}
        return {"verdict": self.verdict}

    def _keep(self, request_id: Any, answer: Any) -> None:
        if not isinstance(request_id, int) or not isinstance(answer, dict):
            raise ValueError("malformed answer")
        self.answers[request_id] = answer
        self.answers.move_to_end(request_id)
        while len(self.answers) > MAX_ANSWERS:
            self.answers.popitem(last=False)

    # -- the front's own calls -----------------------------------------------------------------------------------
    def say(self, **word: Any) -> None:
        """The front's word: `ended=` (how the job ended), `recording=` (where it records)."""
        with self._lock:
            for key, value in word.items():
                setattr(self, key, value)

    def drain(self) -> None:
        """Hand on what the sockets still hold (LiveSource.close): the ranks' last batches."""
        self._draining = True
        self._drained.wait(timeout=5)

    def close(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
        self.server.close()


class Subscriber:
    """`ddptop attach`'s receiver: the front's PUB, as the attach role, into its own Collector and Liveness."""

    def __init__(self, host: str, port: int, job: JobKeys, world_size: int, lost_after_s: float = 10.0):
        self.collector = Collector(world_size, from_start=False)
        self.liveness = Liveness(world_size, lost_after_s)
        self.source = LiveSource(closer=self.close)
        self.sock = transport.client_socket(zmq.SUB, job, "attach", transport.endpoint(host, port),
                                            RCVHWM=transport.RECV_HWM * 10)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddptop-attach", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                if not self.sock.poll(POLL_MS):
                    continue
                events = receive(self.sock.recv_multipart(), self.collector, self.liveness)
                self.source.inject(events or [])
        except Exception as exc:  # said once by the feed, never silent
            self.source.error = (str(exc).splitlines() or [type(exc).__name__])[0]
        self.sock.close(linger=0)

    def close(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
