"""The style metric of the teacher-conditioning experiment (the paper's style
transfer): the teacher sees a different prompt (``tasks.teacher_system_prompt`` /
``teacher_user_template``) that makes it answer in some style, the student never
sees it, and the metric is the share of the student's answers written in that style.

- ``kind: language``: ``langdetect`` (a port of Google's language-detection library)
  names the answer's language; seeded (``DetectorFactory.seed = 0``) so that a text
  always gets the same answer. Text with no letters is in no language.
- ``kind: regex``: the pattern is found in the answer (``re.search``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from distillab.config import StyleConfig


def in_style(text: str, cfg: StyleConfig) -> bool:
    """Whether one answer ``text`` (decoded, special tokens removed) is in the style."""
    if cfg.kind == "regex":
        return re.search(cfg.pattern, text) is not None
    from langdetect import DetectorFactory, detect
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0
    try:
        return detect(text) == cfg.language
    except LangDetectException:  # no features (digits and symbols only)
        return False


def style_share(texts: Sequence[str], cfg: StyleConfig) -> float:
    """Share in [0, 1] of ``texts`` in the style.

    Raises:
        ValueError: no texts.
    """
    if not texts:
        raise ValueError("style_share needs at least one text")
    return sum(in_style(t, cfg) for t in texts) / len(texts)


__all__ = ["in_style", "style_share"]
