"""Raw-socket STOMP probes against a private ActiveMQ (bench/brokers.py), printing the exact
bytes of each answer. The results are written up in activemq-observed.md beside this file.

    python bench/activemq_probe.py            # all probes
    python bench/activemq_probe.py nack dlq   # only those whose name contains a word
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from brokers import ActiveMQ


class Raw:
    """One STOMP connection on a plain socket: send frames as bytes, read raw frames."""

    def __init__(self, port: int, version: str | None = "1.2", login: str | None = "guest",
                 passcode: str = "guest", extra: str = "", connect: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.closed = False
        if connect:
            head = "CONNECT\nhost:localhost\n"
            if version is not None:
                head += f"accept-version:{version}\n"
            if login is not None:
                head += f"login:{login}\npasscode:{passcode}\n"
            self.connected = self.frame(head + extra + "\n")

    def send(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        self.sock.sendall(data + b"\0")

    def read(self, timeout: float = 2.0) -> bytes | None:
        """The next frame's bytes (its NUL and a newline after it included, as sent), or None.
        Heart-beat newlines before a frame are skipped; ``content-length`` is honoured."""
        self.sock.settimeout(timeout)
        while True:
            stripped = self.buf.lstrip(b"\r\n")
            pre = len(self.buf) - len(stripped)
            end = None
            if b"\n\n" in stripped:
                head, _, _ = stripped.partition(b"\n\n")
                length = header(head + b"\n\n", "content-length")
                body_at = pre + len(head) + 2
                if length is not None:
                    if len(self.buf) > body_at + int(length):
                        end = body_at + int(length) + 1
                elif b"\0" in self.buf[body_at:]:
                    end = self.buf.index(b"\0", body_at) + 1
            if end is not None:
                if self.buf[end:end + 1] == b"\n":
                    end += 1
                frame, self.buf = self.buf[pre:end], self.buf[end:]
                return frame
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, OSError):
                return None
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk

    def frame(self, text: str | bytes, timeout: float = 2.0) -> bytes | None:
        self.send(text)
        return self.read(timeout)

    def drain(self, timeout: float = 1.0) -> list[bytes]:
        out = []
        while (f := self.read(timeout)) is not None:
            out.append(f)
        return out

    def is_closed(self, timeout: float = 1.0) -> bool:
        """True if the broker closed the connection (reads EOF within ``timeout``)."""
        if self.closed:
            return True
        extra = self.read(timeout)
        if extra is not None:
            print("   (more)", extra)
        return self.closed

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def header(frame: bytes, name: str) -> str | None:
    for line in frame.split(b"\n\n", 1)[0].split(b"\n")[1:]:
        k, _, v = line.decode().partition(":")
        if k == name:
            return v
    return None


def show(label: str, frame: bytes | list[bytes] | None) -> None:
    """Print the exact bytes; an ERROR body's Java stack trace is cut after its first line."""
    if isinstance(frame, list):
        print(f"{label}: {len(frame)} frame(s)")
        for f in frame:
            show("   ", f)
        return
    if frame is not None and frame.startswith(b"ERROR\n"):
        head, _, body = frame.partition(b"\n\n")
        lines = body.split(b"\n")
        if len(lines) > 3:
            kept = head + b"\n\n" + lines[0] + b"\n"
            print(f"{label}: {kept!r} ...[{len(lines) - 1} more lines: Java stack trace; ends {body[-2:]!r}]")
            return
    print(f"{label}: {frame!r}")


# ------------------------------------------------------------------ probes
def p_connected(port: int) -> None:
    for v in ("1.0", "1.1", "1.2", "1.0,1.1,1.2", None):
        c = Raw(port, version=v, extra="heart-beat:1000,2000\n")
        show(f"accept-version {v} heart-beat:1000,2000 ->", c.connected)
        c.close()
    c = Raw(port, version="1.2", extra="client-id:my-client\n")
    show("accept-version 1.2 client-id:my-client ->", c.connected)
    d = Raw(port, version="1.2", extra="client-id:my-client\n")
    show("second connection, same client-id ->", d.connected)
    print("   closed after:", d.is_closed())
    c.close()
    d.close()
    c = Raw(port, version="2.0")
    show("accept-version 2.0 ->", c.connected)
    print("   closed after:", c.is_closed())
    c = Raw(port, version="1.2", extra="")
    show("STOMP command (not CONNECT) ->", Raw(port, connect=False).frame(
        "STOMP\naccept-version:1.2\nhost:localhost\nlogin:guest\npasscode:guest\n\n"))
    c = Raw(port, connect=False)
    show("SEND before CONNECT ->", c.frame("SEND\ndestination:/queue/x\n\nhi"))
    print("   closed after:", c.is_closed())


def p_login(port: int) -> None:
    for login, pw in (("guest", "wrong"), (None, "")):
        c = Raw(port, version="1.2", login=login, passcode=pw, extra="receipt:c1\n")
        show(f"login {login}/{pw} (receipt:c1 on CONNECT) ->", c.connected)
        print("   closed after:", c.is_closed())
    c = Raw(port, version="1.0", login="guest", passcode="wrong")
    show("1.0 login guest/wrong ->", c.connected)


def p_unknown_ack(port: int) -> None:
    c = Raw(port, "1.2")
    c.frame("SUBSCRIBE\ndestination:/queue/ack-probe\nid:s1\nack:client-individual\n\n", 0.3)
    show("1.2 ACK id:nope receipt:a1 ->", c.frame("ACK\nid:nope\nreceipt:a1\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.1")
    c.frame("SUBSCRIBE\ndestination:/queue/ack-probe\nid:s1\nack:client\n\n", 0.3)
    show("1.1 ACK message-id:nope subscription:s1 ->", c.frame("ACK\nmessage-id:nope\nsubscription:s1\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.2")
    c.frame("SUBSCRIBE\ndestination:/queue/ack-probe\nid:s1\nack:auto\n\n", 0.3)
    show("1.2 NACK id:nope (auto subscription) ->", c.frame("NACK\nid:nope\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.2")
    show("1.2 ACK without id ->", c.frame("ACK\nreceipt:a2\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.1")
    c.frame("SUBSCRIBE\ndestination:/queue/ack-probe\nid:s1\nack:client\n\n", 0.3)
    show("1.1 ACK message-id:ID:nohost-1-1-1:1:1:1:1 (well-formed, unknown) subscription:s1 receipt:a3 ->",
         c.frame("ACK\nmessage-id:ID:nohost-1-1-1:1:1:1:1\nsubscription:s1\nreceipt:a3\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.0")
    c.frame("SUBSCRIBE\ndestination:/queue/ack-probe\nack:client\n\n", 0.3)
    show("1.0 ACK message-id:ID:nohost-1-1-1:1:1:1:1 receipt:a4 ->",
         c.frame("ACK\nmessage-id:ID:nohost-1-1-1:1:1:1:1\nreceipt:a4\n\n"))
    print("   closed after:", c.is_closed())


def p_message_headers(port: int) -> None:
    expires = int(time.time() * 1000) + 600_000
    send = (f"SEND\ndestination:/queue/hdr\npersistent:true\npriority:7\ncolor:red\ncorrelation-id:c-1\n"
            f"reply-to:/queue/r\ntype:t\nexpires:{expires}\nreceipt:r1\n\nbody-1")
    for version in ("1.0", "1.1", "1.2"):
        p = Raw(port, version)
        show(f"[{version}] SEND (no content-length) -> ", p.frame(send))
        p.close()
        c = Raw(port, version)
        c.send("SUBSCRIBE\ndestination:/queue/hdr\nid:s1\nack:client-individual\n\n")
        m = c.read()
        show(f"[{version}] MESSAGE (expires sent {expires})", m)
        if version == "1.2":
            c.send(f"ACK\nid:{header(m, 'ack')}\n\n")
        else:
            c.send(f"ACK\nmessage-id:{header(m, 'message-id')}\nsubscription:s1\n\n")
        c.frame("DISCONNECT\nreceipt:d\n\n")
        c.close()
    p = Raw(port, "1.2")
    p.frame("SEND\ndestination:/queue/hdr2\ncontent-length:5\nreceipt:r\n\nab\0cd")
    p.frame("SEND\ndestination:/queue/hdr2\namq-msg-type:text\ncontent-length:2\nreceipt:r\n\nhi")
    p.frame("SEND\ndestination:/queue/hdr2\ntimestamp:12345\nJMSXGroupID:g1\nx:a\\cb\nreceipt:r\n\nt")
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:/queue/hdr2\nid:s1\n\n")
    show("[1.2] MESSAGE of content-length:5 body", c.read())
    show("[1.2] MESSAGE of amq-msg-type:text content-length:2", c.read())
    show("[1.2] MESSAGE of timestamp:12345 JMSXGroupID:g1 x:a\\cb", c.read())
    c.close()


def p_redelivery(port: int) -> None:
    p = Raw(port, "1.2")
    p.frame("SEND\ndestination:/queue/redeliver\npersistent:true\nreceipt:r\n\none")
    p.frame("SEND\ndestination:/queue/redeliver\nreceipt:r\n\ntwo-nonpersistent")
    for version, ack in (("1.2", "client"), ("1.2", "client-individual"), ("1.1", "client"), ("1.2", "auto")):
        c = Raw(port, version)
        c.send(f"SUBSCRIBE\ndestination:/queue/redeliver\nid:s1\nack:{ack}\n\n")
        got = c.drain(1.0)
        for m in got:
            show(f"[{version} ack:{ack}] MESSAGE", m)
        if ack != "auto":
            c.close()  # no ACK, no DISCONNECT: the socket just closes
            time.sleep(0.5)


def p_nack(port: int) -> None:
    p = Raw(port, "1.2")
    p.frame("SEND\ndestination:/queue/nack-np\ncolor:red\nreceipt:r\n\nnon-persistent")
    p.frame("SEND\ndestination:/queue/nack-p\npersistent:true\ncolor:red\n"
            f"expires:{int(time.time() * 1000) + 600_000}\nreceipt:r\n\npersistent")
    for q in ("nack-np", "nack-p"):
        c = Raw(port, "1.2")
        c.send(f"SUBSCRIBE\ndestination:/queue/{q}\nid:s1\nack:client-individual\n\n")
        m = c.read()
        show(f"MESSAGE on /queue/{q}", m)
        show("NACK receipt:n1 ->", c.frame(f"NACK\nid:{header(m, 'ack')}\nreceipt:n1\n\n"))
        show("after the NACK, same subscription gets", c.read(1.0))
        c.frame("DISCONNECT\nreceipt:d\n\n")
        c.close()
        c = Raw(port, "1.2")
        c.send(f"SUBSCRIBE\ndestination:/queue/{q}\nid:s1\n\n")
        show(f"new subscriber on /queue/{q} gets", c.read(1.0))
        c.close()
    for dlq in ("ActiveMQ.DLQ", "ActiveMQ.DLQ.Queue.nack-np", "ActiveMQ.DLQ.Queue.nack-p"):
        c = Raw(port, "1.2")
        c.send(f"SUBSCRIBE\ndestination:/queue/{dlq}\nid:s1\n\n")
        for m in c.drain(1.0):
            show(f"/queue/{dlq} holds", m)
        c.close()
    # NACK with 1.1 (message-id + subscription) and cumulative client mode
    p.frame("SEND\ndestination:/queue/nack-11\npersistent:true\nreceipt:r\n\na")
    p.frame("SEND\ndestination:/queue/nack-11\npersistent:true\nreceipt:r\n\nb")
    c = Raw(port, "1.1")
    c.send("SUBSCRIBE\ndestination:/queue/nack-11\nid:s1\nack:client\n\n")
    c.read()
    b = c.read()
    show("1.1 client: NACK of the 2nd ->", c.frame(f"NACK\nmessage-id:{header(b, 'message-id')}\n"
                                                   "subscription:s1\nreceipt:n\n\n"))
    c.frame("DISCONNECT\nreceipt:d\n\n")
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:/queue/nack-11\nid:s1\n\n")
    show("/queue/nack-11 afterwards", c.drain(1.0))
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:/queue/ActiveMQ.DLQ\nid:s1\n\n")
    show("ActiveMQ.DLQ afterwards", c.drain(1.0))


def p_no_prefix(port: int) -> None:
    c = Raw(port, "1.2")
    show("SEND destination:noprefix receipt:r1 ->", c.frame("SEND\ndestination:noprefix\nreceipt:r1\n\nx"))
    show("SEND destination:/foo/bar receipt:r2 ->", c.frame("SEND\ndestination:/foo/bar\nreceipt:r2\n\nx"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:/queue/noprefix\nid:s1\n\n")
    show("/queue/noprefix gets", c.read(1.0))
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:noprefix\nid:s1\n\n")
    c.frame("SEND\ndestination:/queue/noprefix\nreceipt:r3\n\ny")
    show("SUBSCRIBE destination:noprefix, then SEND /queue/noprefix ->", c.drain(1.0))
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:/foo/bar\nid:s1\n\n")
    show("SUBSCRIBE destination:/foo/bar gets", c.drain(1.0))
    c = Raw(port, "1.2")
    c.send("SUBSCRIBE\ndestination:/topic/ActiveMQ.Advisory.Queue\nid:adv\n\n")
    names = [f.split(b'"string":"', 1)[1].split(b'"', 1)[0].decode() for f in c.drain(1.0)
             if b'"string":"' in f]
    print("   queues the broker has (advisory topic, DestinationInfo.destination.string):", names)
    c.send("SEND\ndestination:/queue/adv-probe\nreceipt:r\n\nx")
    show("   SEND to a new queue /queue/adv-probe on the same connection ->", c.drain(1.0))
    c = Raw(port, "1.2")
    show("SEND without destination ->", c.frame("SEND\nreceipt:r4\n\nx"))
    print("   closed after:", c.is_closed())


def p_selector(port: int) -> None:
    c = Raw(port, "1.2")
    show("SUBSCRIBE selector:color = ' receipt:s ->",
         c.frame("SUBSCRIBE\ndestination:/queue/sel\nid:s1\nselector:color = '\nreceipt:s\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.2")
    show("SUBSCRIBE selector:color === 'red' receipt:s ->",
         c.frame("SUBSCRIBE\ndestination:/queue/sel\nid:s1\nselector:color === 'red'\nreceipt:s\n\n"))
    print("   closed after:", c.is_closed())
    c = Raw(port, "1.2")
    show("SUBSCRIBE selector:n > 5 receipt:s (valid) ->",
         c.frame("SUBSCRIBE\ndestination:/queue/sel\nid:s1\nselector:n > 5\nreceipt:s\n\n"))
    p = Raw(port, "1.2")
    p.frame("SEND\ndestination:/queue/sel\nn:3\nreceipt:r\n\nthree")
    p.frame("SEND\ndestination:/queue/sel\nn:10\nreceipt:r\n\nten")
    show("   selector n > 5 with string headers n:3, n:10 delivers", c.drain(1.0))


PROBES = {"connected": p_connected, "login": p_login, "unknown_ack": p_unknown_ack,
          "message_headers": p_message_headers, "redelivery": p_redelivery, "nack_dlq": p_nack,
          "no_prefix": p_no_prefix, "selector": p_selector}


def main() -> None:
    words = sys.argv[1:]
    broker = ActiveMQ()
    broker.start()
    try:
        print(f"# ActiveMQ on 127.0.0.1:{broker.port}")
        for name, probe in PROBES.items():
            if words and not any(w in name for w in words):
                continue
            print(f"\n## {name}")
            probe(broker.port)
    finally:
        print("\n## broker log (WARN and above)")
        for line in Path(broker.log_path).read_text(errors="replace").splitlines():
            if "| WARN" in line or "| ERROR" in line:
                print(line[:300])
        broker.stop()


if __name__ == "__main__":
    main()
