"""Streamed decode speed through `localchat serve` against `localchat run`'s: one engine, the same prompts.

For each prompt, in alternating order: the answer decoded in process as `localchat run` decodes it (its
decode tok/s, measured on the engine thread), then the same answer streamed through the server (the real
Starlette app on uvicorn, in this process as `localchat serve` runs it) to a client in a process of its
own, which measures tok/s from the chunks as they arrive (tokens after the first chunk over the time
since it came). Greedy: both write the same tokens, which the report checks.

    python benchmarks/bench_serve.py --model demo --device cuda --prompts 8 --out FILE
    python benchmarks/bench_serve.py --random-weights llama-8b --prompts 4 --out FILE
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The client: one process for all requests, so that its start costs nothing and its parsing shares no GIL
# with the server. Reads one request per line (url, body) and prints one JSON result per line.
CLIENT = r"""
import http.client, json, sys, time, urllib.parse
for line in sys.stdin:
    url, body = json.loads(line)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = last = None
    ids, usage = [], None
    for raw in response:
        if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(raw[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            new = choice.get("token_ids") or []
            if new:
                ids += new
                last = time.perf_counter()
                if first is None:
                    first = (last, len(ids))
    conn.close()
    tok_s = (len(ids) - first[1]) / (last - first[0]) if first and last > first[0] else 0.0
    print(json.dumps({"client_tok_s": tok_s, "client_ttft_s": first[0] - t0 if first else None,
                      "token_ids": ids, "usage": usage}), flush=True)
"""


class WordTokenizer:
    """For random weights: a prompt's text is its token ids ("ids 5 17 ..."), and each token decodes as
    one short word, so that every step sends a text chunk as a real model's does."""

    eos_token_ids = frozenset()

    def apply_chat_template(self, messages, max_len=None):
        return [int(x) for x in messages[-1]["content"].split()[1:]]

    def decode(self, ids):
        return " w" * len(ids)


def build(args):
    if args.random_weights:
        import torch

        from benchmarks.harness.shapes import random_engine

        engine = random_engine(args.random_weights, device=args.device, max_seq_len=args.max_seq_len,
                               force_accept=args.force_accept)
        engine.tokenizer = WordTokenizer()
        g = torch.Generator().manual_seed(1)
        vocab = engine.runner.config.vocab_size
        prompts = [[{"role": "user", "content": "ids " + " ".join(map(str, torch.randint(0, vocab, (128,),
                                                                                           generator=g).tolist()))}]
                   for _ in range(args.prompts)]
        return engine, prompts, "random token ids, 128 each"
    from benchmarks.harness.prompts import chat_prompts_from
    from engine import Engine

    engine = Engine.load(args.model, draft=args.draft, device=args.device, max_seq_len=args.max_seq_len)
    prompts, source = chat_prompts_from(args.prompts, "instruct")
    return engine, prompts, source


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo")
    p.add_argument("--draft", default=None)
    p.add_argument("--random-weights", default=None, metavar="CONFIG")
    p.add_argument("--force-accept", type=int, default=None,
                   help="with --random-weights: a random EAGLE-3 head whose verify steps each give this many tokens")
    p.add_argument("--device", default=None)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import uvicorn

    from engine.types import SamplingParams
    from server.api import build_app
    from server.command import SWITCH_INTERVAL_S, bind
    from server.scheduler import Scheduler

    engine, prompts, source = build(args)
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as `localchat serve` runs
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    scheduler = Scheduler(engine, 8)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, scheduler), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    client = subprocess.Popen([sys.executable, "-c", CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)

    def run_side(messages):
        engine.reset()
        last, ids = None, []
        for event in engine.stream(messages, SamplingParams(max_tokens=args.new_tokens)):
            ids += event.token_ids
            last = event
        return {"tok_s": last.stats.decode_tok_s, "token_ids": ids, "accept_len_mean": last.stats.accept_len_mean}

    def serve_side(messages):
        engine.reset()  # the engine is idle between requests: both sides prefill the whole prompt
        body = {"messages": messages, "max_tokens": args.new_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True}
        client.stdin.write(json.dumps([url, body]) + "\n")
        client.stdin.flush()
        out = json.loads(client.stdout.readline())
        return {"tok_s": out["client_tok_s"], "server_tok_s": out["usage"]["localchat"]["decode_tok_s"],
                "token_ids": out["token_ids"]}

    for messages in prompts[:1]:  # warm-up, uncounted: first-use allocations, graph captures
        run_side(messages)
        serve_side(messages)
    rows = []
    for r in range(args.rounds):
        for i, messages in enumerate(prompts):
            first, second = (run_side, serve_side) if (i + r) % 2 == 0 else (serve_side, run_side)
            a, b = first(messages), second(messages)
            run, served = (a, b) if first is run_side else (b, a)
            rows.append({"round": r, "prompt": i, "tokens": len(run["token_ids"]), "run_tok_s": run["tok_s"],
                         "serve_client_tok_s": served["tok_s"], "serve_engine_tok_s": served["server_tok_s"],
                         "accept_len_mean": run["accept_len_mean"],
                         "same_tokens": run["token_ids"] == served["token_ids"]})
            print(json.dumps(rows[-1]), flush=True)
    client.stdin.close()
    server.should_exit = True
    scheduler.close()
    total_run = sum(x["tokens"] / x["run_tok_s"] for x in rows if x["run_tok_s"])
    total_served = sum(x["tokens"] / x["serve_client_tok_s"] for x in rows if x["serve_client_tok_s"])
    num_tokens = sum(x["tokens"] for x in rows)
    report = {
        "what": "streamed decode tok/s through localchat serve (client-measured) vs localchat run (engine-measured)",
        "model": engine.model_name, "draft": engine.draft_name, "device": engine.device, "prompts": source,
        "new_tokens": args.new_tokens, "rounds": args.rounds,
        "run_tok_s": num_tokens / total_run, "serve_tok_s": num_tokens / total_served,
        "serve_over_run": total_run / total_served, "all_tokens_equal": all(x["same_tokens"] for x in rows),
        "rows": rows, "machine": platform.node(), "python": platform.python_version(),
    }
    try:
        import torch

        report["torch"] = torch.__version__
        if torch.cuda.is_available():
            report["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
