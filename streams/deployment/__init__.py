"""Deployment files written from memproj's registries (``memproj deploy``): the Kubernetes
worker manifests, the worker services of docker-compose.yml, the Prometheus scrape targets and
the settings reference. Each writer is a pure function of a registry; tests compare the
committed files with what they write, so a file edited by hand, or a registry changed without
running the command again, fails CI."""

from __future__ import annotations

import textwrap


def comment(text: str, indent: str = "", width: int = 96) -> str:
    """``text`` as YAML comment lines of at most ``width`` columns."""
    lines = textwrap.wrap(text, width - len(indent) - 2, break_on_hyphens=False)
    return "".join(f"{indent}# {line}\n" for line in lines)
