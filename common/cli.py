"""The command-line parser every script uses: both spellings of a flag, `--length_scale` and `--length-scale`.

Why: the guides and the tools users come from disagree on the separator (Piper and Coqui write `--length_scale`,
other guides `--length-scale`, `--checkpoint-dir`), and a flag refused for its separator sends a user to the
source. `FlagParser` is an `argparse.ArgumentParser` that, before parsing, rewrites a long flag it does not know
into the other spelling when that one is known (`_` <-> `-` after the leading `--`), so every script takes both
without doubling its help. A flag known in neither spelling is left as typed: argparse's own error names it.
Other names for the same option (`--ckpt` for `--checkpoint`) are plain extra option strings of `add_argument`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def other_spelling(flag: str) -> str | None:
    """`--length-scale` -> `--length_scale` and back; None for a flag with neither separator (or a short one)."""
    if not flag.startswith("--"):
        return None
    body = flag[2:]
    if "_" in body:
        return "--" + body.replace("_", "-")
    if "-" in body:
        return "--" + body.replace("-", "_")
    return None


class FlagParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` that accepts a long flag in either spelling (see the module docstring)."""

    def known_spelling(self, token: str) -> str:
        """`token` as this parser knows it: unchanged when known (or not a long flag), else its other spelling
        when that is known. `--flag=value` keeps its value."""
        if not token.startswith("--") or token == "--":
            return token
        flag, eq, value = token.partition("=")
        if flag in self._option_string_actions:
            return token
        other = other_spelling(flag)
        if other is not None and other in self._option_string_actions:
            return other + eq + value
        return token

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        import sys

        args = list(sys.argv[1:] if args is None else args)
        rewritten: list[str] = []
        for i, token in enumerate(args):
            if token == "--":  # everything after it is positional
                rewritten.extend(args[i:])
                break
            rewritten.append(self.known_spelling(token))
        return super().parse_known_args(rewritten, namespace)

