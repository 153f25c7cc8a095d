"""Decode plans: each method `gqa-spec generate` runs, as one object with the same six steps.

  plan = plan_for(args)                     # the method the flags choose, its flags checked
  slots = plan.cache_length(max_decode_len)  # the target's cache: sizes inputs and memory
  plan.make_draft(target_config, mesh=..., param_dtype=...)
  plan.calibrate(decoding, batches)         # --gamma auto / --tree best:auto: measure c, v, alpha
  result = plan.run(decoding, inputs, n, rng, plain)   # one batch
  stats = plan.stats()                      # the method's `--stats` fields

`PLANS` lists the methods; the first whose `chosen(args)` holds wins, and a new method is a `Plan`
subclass and one line there. A flag of another method is an error in one line (`--gamma-max needs
--gamma auto`, `--gamma auto is not supported with --tree`), checked before anything loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import Any, Callable, Dict, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import adaptive, adaptive_tree, cost_calibration, guard as guard_lib
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.drafts import factory
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import cache_length
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.errors import UserError

# flag -> (argparse dest, the value that means "not given", the method(s) it belongs to)
METHOD_FLAGS = {
    '--gamma': ('gamma', None, 'a chain --draft (not --tree)'),
    '--gamma-max': ('gamma_max', None, '--gamma auto'),
    '--gamma-policy': ('gamma_policy', None, '--gamma auto'),
    '--draft-confidence': ('draft_confidence', None, '--gamma auto'),
    '--cost-ratio': ('cost_ratio', None, '--gamma auto or --tree best:auto'),
    '--guard': ('guard', None, '--gamma auto or --tree best:auto'),
    '--tree': ('tree', None, 'a --draft'),
    '--stage2': ('stage2', None, 'a model --draft'),
    '--stage2-gamma': ('stage2_gamma', None, '--stage2'),
    '--loop-chunk': ('loop_chunk', 1, 'autoregressive decoding (no --draft)'),
    '--lenience': ('lenience', 1.0, 'a chain --draft (not --tree)'),
}
FLOAT_FLAGS = ('temperature', 'top_p', 'lenience', 'cost_ratio', 'draft_confidence')
DEFAULT_GAMMA, DEFAULT_GAMMA_MAX, DEFAULT_STAGE2_GAMMA = 4, 8, 3


@dataclasses.dataclass
class Decoding:
  """What every plan's run reads: the target (a `Decoder`, on a mesh or not) and its parameters,
  the loops to run (`decoding.mesh`'s under --model-parallel), the output length and sampling."""

  target: Any
  params: Any
  max_len: int
  config: SamplingConfig
  batch: int
  run_ar: Callable
  run_spec: Callable
  run_tree: Callable

  def init(self, enc, call_tokens: int = 1):
    return self.target.init(self.params, enc, cache_length(self.max_len, call_tokens))

  def skip(self, n: int):
    return np.arange(self.batch) >= n  # dummy rows filling the last batch


def _shown(flag: str, value) -> str:
  if flag == '--guard':
    return '--guard' if value else '--no-guard'
  return '--gamma auto' if flag == '--gamma' and value == 'auto' else flag


class Plan:
  """Autoregressive decoding, greedy or sampled: the base every method extends.

  Attributes:
    selector: how the user chooses the method (in messages).
    takes: the `METHOD_FLAGS` it reads; any other one given is refused.
    on_mesh: whether it runs under --model-parallel.
  """

  selector = 'autoregressive decoding'
  takes = frozenset({'--loop-chunk'})
  on_mesh = True

  def __init__(self, args: argparse.Namespace):
    self.args = args
    self.draft = self.draft_init = None
    self.draft_desc = args.draft
    self.calibration_seconds = None

  @staticmethod
  def chosen(args: argparse.Namespace) -> bool:
    del args
    return True

  def validate(self) -> None:
    """Raises `UserError` for a flag this method does not read, or a number out of range."""
    args = self.args
    for name in ('max_decode_len', 'batch_size', 'loop_chunk', 'model_parallel', 'gamma',
                 'gamma_max', 'stage2_gamma'):
      value = getattr(args, name)
      if value is not None and value != 'auto' and value < 1:
        raise UserError(f'--{name.replace("_", "-")} must be >= 1, got {value}')
    for name in FLOAT_FLAGS:
      value = getattr(args, name)
      if value is not None and not math.isfinite(value):
        raise UserError(f'--{name.replace("_", "-")} must be a finite number, got {value}')
    self.sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                                   top_p=args.top_p, lenience=args.lenience)
    for flag, (dest, unset, needs) in METHOD_FLAGS.items():
      value = getattr(args, dest)
      if value is None or value == unset or flag in self.takes:
        continue
      shown = _shown(flag, value)
      if shown in ('--gamma auto', '--tree', '--stage2') and type(self) is not Plan:
        raise UserError(f'{shown} is not supported with {self.selector}')
      raise UserError(f'{shown} needs {needs}')
    if args.model_parallel is not None and not self.on_mesh:
      raise UserError(f'{self.selector} is not supported with --model-parallel')

  def call_tokens(self) -> int:
    """Tokens of the widest target call (the cache's room past the last output token)."""
    return 1

  def cache_length(self, max_len: int) -> int:
    return cache_length(max_len, self.call_tokens())

  def make_draft(self, target_config, **placement) -> None:
    """Builds the draft (`drafts.factory`), its state's init and description."""

  def calibrate(self, d: Decoding, batches: Sequence[Tuple[Any, int]]) -> None:
    """Measures what the method's policy needs on the first batches (before the timed runs)."""

  def guard(self, d: Decoding, batches: Sequence[Tuple[Any, int]]):
    """The `guard.SpeculationGuard` of the timed runs, or None."""
    return None

  def run(self, d: Decoding, enc, n: int, rng, plain: bool = False):
    """One batch of `enc [batch, S]` whose first `n` rows are real; `plain`: the guard's greedy
    call (adaptive methods)."""
    del plain
    return d.run_ar(d.target, d.init(enc), rng, max_decode_len=d.max_len, config=d.config,
                    skip=d.skip(n), loop_chunk=self.args.loop_chunk)

  def stats(self) -> Dict[str, Any]:
    """The method's `--stats` fields (None where they do not apply)."""
    return dict(draft=self.draft_desc, gamma=None, cost_ratio=None, verify_ratio=None,
                cost_ratio_measured=None, calibration_seconds=self.calibration_seconds,
                alpha_init=None, speculated=None, guard=None, tree=None, tree_node_widths=None,
                tree_accepted_init=None, stage2=None, stage2_gamma=None,
                loop_chunk=self.args.loop_chunk if self.draft is None else None)


class ChainPlan(Plan):
  """Speculative decoding with a chain of `--gamma` draft tokens (`speculative.decode`)."""

  selector = '--draft'
  takes = frozenset({'--gamma', '--lenience'})

  @staticmethod
  def chosen(args):
    return args.draft != 'none'

  @property
  def gamma(self) -> int:
    return self.args.gamma or DEFAULT_GAMMA

  def call_tokens(self):
    return self.gamma + 1

  def make_draft(self, target_config, **placement):
    self.draft, self.draft_init, self.draft_desc = factory.make_draft(
        self.args.draft, target_config, self.gamma, self.args.max_decode_len, **placement)

  def run(self, d, enc, n, rng, plain=False):
    return d.run_spec(d.target, d.init(enc, self.call_tokens()), self.draft, self.draft_init(enc),
                      rng, gamma=self.gamma, max_decode_len=d.max_len, config=d.config,
                      skip=d.skip(n))

  def stats(self):
    return {**super().stats(), 'gamma': self.gamma}


class StagedPlan(ChainPlan):
  """A model draft that speculates its own tokens with a bigram (`drafts.model.StagedDraft`)."""

  selector = '--stage2'
  takes = frozenset({'--gamma', '--lenience', '--stage2', '--stage2-gamma'})

  @staticmethod
  def chosen(args):
    return args.stage2 is not None

  def validate(self):
    super().validate()
    if self.args.gamma == 'auto':
      raise UserError('--gamma auto is not supported with --stage2')
    if self.args.draft == 'none':
      raise UserError('--stage2 needs a model --draft')

  def make_draft(self, target_config, **placement):
    self.draft, self.draft_init, self.draft_desc = factory.make_staged_draft(
        self.args.draft, self.args.stage2, target_config, self.gamma,
        self.args.stage2_gamma or DEFAULT_STAGE2_GAMMA, self.args.max_decode_len,
        shape=getattr(self, 'shape', None), **placement)

  def stats(self):
    return {**super().stats(), 'stage2': self.args.stage2,
            'stage2_gamma': self.args.stage2_gamma or DEFAULT_STAGE2_GAMMA}


class TreePlan(StagedPlan):
  """Token-tree verification (`tree_speculative.decode`; with `--stage2` a staged tree draft)."""

  selector = '--tree'
  takes = frozenset({'--tree', '--stage2', '--stage2-gamma'})

  @staticmethod
  def chosen(args):
    return args.tree is not None

  def validate(self):
    Plan.validate(self)
    args = self.args
    if args.stage2_gamma is not None and args.stage2 is None:
      raise UserError('--stage2-gamma needs --stage2')
    self.shape = self._parse(args.tree)
    if self.shape.depth > args.max_decode_len:
      raise UserError(f'--tree depth {self.shape.depth} is more than --max-decode-len '
                      f'{args.max_decode_len}: no row accepts more tokens than that; give depth <= '
                      f'{args.max_decode_len}')
    if args.draft == 'none':
      raise UserError('--tree needs a --draft')

  def _parse(self, spec: str):
    return TreeShape.parse(spec)

  def call_tokens(self):
    return self.shape.num_nodes + 1

  def make_draft(self, target_config, **placement):
    if self.args.stage2 is not None:
      super().make_draft(target_config, **placement)
      return
    self.draft, self.draft_init, self.draft_desc = factory.make_tree_draft(
        self.args.draft, target_config, self.shape, self.args.max_decode_len, **placement)

  def run(self, d, enc, n, rng, plain=False):
    return d.run_tree(d.target, d.init(enc, self.call_tokens()), self.draft, self.draft_init(enc),
                      rng, shape=self.shape, max_decode_len=d.max_len, config=d.config,
                      skip=d.skip(n))

  def stats(self):
    out = {**super().stats(), 'gamma': None, 'tree': self.shape.describe()}
    if self.args.stage2 is None:
      out.update(stage2=None, stage2_gamma=None)
    return out


class _Adaptive(Plan):
  """What `--gamma auto` and `--tree best:auto` share: a policy (`policy`) whose costs are given
  (`--cost-ratio`) or measured on the first batches (`calibrate`), a guard on measured costs,
  and runs in which a row that will not speculate needs no draft state."""

  on_mesh = False
  loop: Any = None  # the module whose `decode` runs it
  no_speculation: Dict[str, int] = {}  # the policy's fields for the guard's greedy calls

  def validate(self):
    super().validate()
    args = self.args
    if args.guard is not None and (args.cost_ratio is not None or args.gamma_policy == 'heuristic'):
      flag = '--guard' if args.guard else '--no-guard'
      raise UserError(f'{flag}: the guard runs with measured costs only, so not with --cost-ratio'
                      if args.cost_ratio is not None else
                      f'{flag} applies to --gamma-policy optimal (heuristic has no guard)')
    self.calibration = None

  @property
  def measured(self) -> bool:
    """Whether the costs are measured: not given, nor unused (the heuristic gamma policy)."""
    return self.args.cost_ratio is None and self.args.gamma_policy != 'heuristic'

  def calibrate(self, d, batches):
    if not self.measured:
      return
    t0 = time.perf_counter()
    # (target state, draft state) of each batch, made as read: timed on the first, alpha also
    # read on the next ones as far as the calibration asks
    states = ((d.init(enc, self.call_tokens()), self.draft_init(enc))
              for enc in (jnp.asarray(b[0]) for b in batches))
    target_state, draft_state = next(states)
    self.calibration = cost_calibration.measure_costs(
        d.target, target_state, self.draft, draft_state, d.max_len, self._costs_of(),
        more=states, config=d.config)
    self.policy = self.policy.calibrated(self.calibration)
    self.calibration_seconds = time.perf_counter() - t0

  def _costs_of(self):
    """What the policy's `measure_costs` takes after the output length: the policy itself."""
    return self.policy

  def guard(self, d, batches):
    """Times the run's own calls against greedy decoding's unless --no-guard, with a call's
    encoder pass timed on the first batch at the slots the run's calls compiled."""
    if self.calibration is None or self.args.guard is False or not self.policy.speculates:
      return None
    self._guard = guard_lib.SpeculationGuard(self.calibration.step_seconds, guard_lib.call_seconds(
        lambda: d.init(batches[0][0], self.call_tokens())))
    return self._guard

  def run(self, d, enc, n, rng, plain=False):
    policy = dataclasses.replace(self.policy, **self.no_speculation) if plain else self.policy
    return self.loop.decode(d.target, d.init(enc, policy.call_tokens), self.draft,
                            self.draft_init(enc) if policy.speculates else None, rng,
                            adaptive=policy, max_decode_len=d.max_len, config=d.config,
                            skip=d.skip(n))

  def stats(self):
    guard = getattr(self, '_guard', None)
    return {**super().stats(), 'cost_ratio_measured': self.measured,
            'speculated': self.policy.speculates, 'guard': guard.to_dict() if guard else None}


class AdaptiveChainPlan(_Adaptive):
  """`--gamma auto`: the draft length chosen in the loop at every iteration (`adaptive`)."""

  selector = '--gamma auto'
  loop, no_speculation = adaptive, {'gamma_init': 0}
  takes = frozenset({'--gamma', '--gamma-max', '--gamma-policy', '--draft-confidence',
                     '--cost-ratio', '--guard', '--lenience'})

  @staticmethod
  def chosen(args):
    return args.gamma == 'auto'

  def validate(self):
    super().validate()
    args = self.args
    if args.draft == 'none':
      raise UserError('--gamma auto needs a --draft')
    if args.gamma_policy == 'heuristic' and args.cost_ratio is not None:
      raise UserError('--cost-ratio applies to --gamma-policy optimal')
    self.policy = AdaptiveGamma(
        gamma_max=args.gamma_max or DEFAULT_GAMMA_MAX, policy=args.gamma_policy or 'optimal',
        cost_ratio=args.cost_ratio or 0.0, confidence=args.draft_confidence or 0.0)

  def call_tokens(self):
    return self.policy.gamma_max + 1

  def _costs_of(self):
    return self.policy.gamma_max  # `cost_calibration.measure_costs` times the chain up to gamma_max

  def make_draft(self, target_config, **placement):
    self.draft, self.draft_init, self.draft_desc = factory.make_draft(
        self.args.draft, target_config, self.policy.gamma_max, self.args.max_decode_len,
        **placement)
    if self.policy.confidence and not hasattr(self.draft, 'propose_upto'):
      raise UserError(f'--draft-confidence needs a model draft, not {self.args.draft}')

  def stats(self):
    out = {**super().stats(), 'gamma': self.policy.describe()}
    if self.policy.policy == 'optimal':
      out.update(cost_ratio=self.policy.cost_ratio, verify_ratio=self.policy.verify_ratio,
                 alpha_init=self.policy.alpha_init)
    return out


class AdaptiveTreePlan(_Adaptive, TreePlan):
  """`--tree best:auto[:N],depth:D[,width:W]`: each row's tree size chosen in the loop
  (`adaptive_tree`)."""

  selector = '--tree best:auto'
  loop, no_speculation = adaptive_tree, {'fixed_nodes': 0}
  takes = frozenset({'--tree', '--cost-ratio', '--guard'})

  @staticmethod
  def chosen(args):
    return args.tree is not None and args.tree.startswith('best:auto')

  def _parse(self, spec):
    self.policy = AdaptiveTree.parse(spec, cost_ratio=self.args.cost_ratio or 0.0)
    return self.policy.shape  # the largest tree: the draft grows it every iteration

  def stats(self):
    p = self.policy
    return {**super().stats(), 'cost_ratio': p.cost_ratio, 'verify_ratio': p.verify_ratio,
            'alpha_init': p.alpha_init, 'tree': p.describe(), 'tree_node_widths': list(p.widths),
            'tree_accepted_init': list(p.accepted_init) if p.accepted_init else None}


# The methods, the first chosen wins: a new method is one line here.
PLANS = (AdaptiveTreePlan, TreePlan, StagedPlan, AdaptiveChainPlan, ChainPlan, Plan)


def plan_for(args: argparse.Namespace) -> Plan:
  """The plan of the method `args` choose, its flags checked (`UserError` otherwise)."""
  if args.draft != 'none':
    factory.check_spec(args.draft, '--draft')
  plan = next(cls for cls in PLANS if cls.chosen(args))(args)
  plan.validate()
  return plan
