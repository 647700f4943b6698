"""`localchat serve`: bind the port, load the model, then serve the OpenAI-compatible API until Ctrl+C."""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys

from engine.errors import UserError

# The engine thread needs the GIL back right after each step; Python's default 5 ms switch interval
# would let the event loop's JSON and socket work hold it for a whole step (as in the app).
SWITCH_INTERVAL_S = 0.0002


def cmd_serve(args) -> int:
    if args.max_queue < 0:
        raise UserError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.api_key is not None and not args.api_key.strip():
        raise UserError("--api-key is empty; give a key, or leave the flag out for a server without one")
    sock = bind(args.host, args.port)  # first: a port in use is said at once, not after the load
    host, port = sock.getsockname()[:2]
    if not is_loopback(args.host) and not args.api_key:
        print(f"localchat: warning: listening on {args.host} without --api-key: anyone who can reach this "
              "machine can use the model", file=sys.stderr, flush=True)
    from engine import Engine

    engine = Engine.load(args.model, draft=args.draft, device=args.device, max_seq_len=args.max_seq_len,
                         draft_steps=args.draft_steps, use_graphs=not args.no_graphs,
                         on_progress=lambda text, _: print(f"[localchat] {text}", file=sys.stderr, flush=True),
                         threads=args.threads, tree=getattr(args, "tree", None))
    import uvicorn

    from server.api import ServeOptions, build_app
    from server.scheduler import Scheduler

    pays, note = True, ""
    sampled = (True, "")
    if engine.has_draft and not args.draft:  # a model's default draft, where it is slower: off unless asked
        pays, note = engine.speculation_pays(lambda text: print(f"[localchat] {text}", file=sys.stderr, flush=True))
        sampled = engine.speculation_pays(sampled=True)
        for off, why, which in ((not pays, note, ""), (not sampled[0], sampled[1], " for sampled requests")):
            if off:
                print(f"[localchat] speculation off by default{which}: {why} (a request may still ask for it "
                      'with "speculative": true)', file=sys.stderr, flush=True)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    scheduler = Scheduler(engine, args.max_queue, spec_default=pays, spec_note=note, spec_sampled=sampled)
    app = build_app(engine, scheduler, ServeOptions(api_key=args.api_key))
    shown = f"[{host}]" if ":" in host else host
    draft = f" with draft {engine.draft_name}" if engine.draft_name else ""
    print(f"[localchat] serving {engine.model_name}{draft} on {engine.device} at http://{shown}:{port}/v1 "
          f"(one request decodes at a time, {args.max_queue} may wait); Ctrl+C stops", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=3))
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.close()
    return 0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one line saying why not."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be from 0 to 65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"--host {host} is not an address this machine can listen on ({e})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is in use: stop what listens there, or choose "
                            "another with --port") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise UserError(f"not allowed to listen on port {port}: ports below 1024 need root; "
                            "choose another with --port") from None
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock
