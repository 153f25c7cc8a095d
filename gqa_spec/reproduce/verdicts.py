"""What every paper claim of the study is made of: a `Claim` row, its verdicts, the margins its
verdicts use, and how intervals are printed. The rules that decide each claim are in
`claims.py` (speed, speculative decoding, the premise) and `quality_claims.py` (claims 1-3)."""

from __future__ import annotations

import dataclasses
from typing import Tuple

HOLDS, DOES_NOT_HOLD, UNRESOLVED, NOT_RUN = ('holds', 'does not hold', 'unresolved at this scale',
                                             'not run')
PREMISE_NOT_MET = 'premise not met at this scale'
PREMISE_MAX_GAMMA = 64  # the gammas Theorem 8 is searched over for the premise
TIME_MARGIN = 1.1  # timing ratios within 10% are noise on a shared CPU
ROUND_COVERAGE = 0.9  # the least coverage of `rounds_interval`
ALPHA_MARGIN = 0.05
ACCEPT_MARGIN = 0.1  # tokens per target call
SPEEDUP_GOAL = 1.5
RATIO_GOAL = 0.9
QUALITY_BAR = {'ddtp_translate_en_de': 15.0, 'ddtp_summarize': 30.0}  # the bar for MHA
INDEPENDENT_DRAFT = 'draft model'


@dataclasses.dataclass
class Claim:
  key: str
  claim: str
  paper: str
  ours: str = '-'
  interval: str = '-'
  verdict: str = NOT_RUN
  why: str = ''
  text_metric: str = '-'  # quality claims decided on the likelihood: BLEU / ROUGE-1's statistic,
                          # interval and verdict


def fmt_signed(x: float) -> str:
  return f'{x:+.2f}'


def fmt_interval(low: float, high: float) -> str:
  return f'[{low:+.2f}, {high:+.2f}]'


def direction(low: float, high: float) -> Tuple[str, str]:
  if low > 0:
    return HOLDS, 'interval above 0'
  if high < 0:
    return DOES_NOT_HOLD, "interval excludes the paper's direction"
  return UNRESOLVED, 'interval spans 0'
