"""Repository-level pytest settings: without torch, skip collecting the live backend's modules
(``python -m pytest --doctest-modules pacectl`` then still works; its tests skip on their own)."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["pacectl/torchdist/*"]
