"""The ``ooospec`` console script: one subcommand per job, each owned by the module that does the work.

Each module listed in ``COMMANDS`` exposes ``add_arguments(parser)`` and ``run_cli(args) -> int | None``.
Modules are imported lazily so that ``ooospec ingest`` never pays for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "ingest": ("ooospec.pipelines.ingest", "parse raw tool-calling datasets into records (DVC stage)"),
    "dedupe": ("ooospec.pipelines.dedupe", "dedupe records, hold out benchmarks, write train + eval sets (DVC stage)"),
    "bench": ("ooospec.eval.bench.cli", "time speculative decoding methods against greedy AR on a benchmark"),
    "models": ("ooospec.models_cli", "list / fetch the target models this machine can obtain"),
    "teacher": ("ooospec.pipelines.teacher", "decode teacher traces for training records (DVC stage)"),
    "normalize": ("ooospec.pipelines.normalize", "parse teacher traces into compact schema-valid calls (DVC stage)"),
    "expand-slots": ("ooospec.pipelines.expand_slots", "expand calls into sidecar supervision pairs (DVC stage)"),
    "train-sidecar": ("ooospec.pipelines.train_sidecar", "LoRA-train the sidecar (DVC stage)"),
    "eval-sidecar": ("ooospec.pipelines.eval_sidecar", "offline sidecar quality and slot-wave latency (DVC stage)"),
    "sidecar-report": ("ooospec.eval.sidecar.report", "compare trained sidecars: quality vs slot-wave latency"),
    "sidecar-compare": ("ooospec.eval.sidecar.compare", "which sidecar to ship: two adapters' transfer runs + quality"),
    "sidecar-engines": ("ooospec.eval.sidecar.engines", "a sidecar wave alone: engines x shapes, cold, warm"),
    "transfer-report": ("ooospec.eval.transfer.report", "rebuild the transfer report (md + html) from its JSON"),
    "export": ("ooospec.pipelines.export_adapter", "export the adapter as a Hub model folder, optionally push"),
    "sidecar": ("ooospec.sidecar_cli", "serve the sidecar (OpenAI-compatible completions) or predict calls offline"),
    "serve": ("ooospec.serve_cli", "OpenAI-compatible chat completions server with tools (sessions, streaming)"),
    "vllm-bench": ("ooospec.eval.vllm.bench", "vLLM plain / ngram vs ooo-spec's drafts inside vLLM (needs vLLM)"),
    "vllm-load": ("ooospec.eval.vllm.load", "vLLM's OpenAI server under load: plain vs speculative (needs vLLM)"),
    "vllm-report": ("ooospec.eval.vllm.report", "one table over vllm-bench results (eval/reports/vllm)"),
    "agent-bench": ("ooospec.eval.agent.cli", "replay multi-step tool dialogues: sessions and speculative tools"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ooospec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if name == wanted:  # only import the module that will run
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name and e.name.startswith("ooospec"):
                    parser.error(f"command {name!r} is not available in this build ({e.name} missing)")
                raise
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run_cli)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
