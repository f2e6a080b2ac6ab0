"""`rhymectl doctor`: what this machine has, and whether it is ready."""

from __future__ import annotations

import typer

from rhymectl.output import emit_json, out


def register(app: typer.Typer) -> None:
    app.command("doctor", help=(
        "Report torch / vLLM / DeepSpeed / arctic-inference versions, the device, and "
        "whether DeepSpeed's CPU communication op is built.\n\nExample: rhymectl doctor --json"))(doctor)


def doctor(json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout.")) -> None:
    from pipeline.report.doctor import collect

    report = collect()
    if json_out:
        emit_json(report)
        return
    for key, value in report.items():
        out.print(f"{key:<22} {value}")
