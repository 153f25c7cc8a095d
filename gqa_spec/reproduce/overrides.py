"""`gqa-spec reproduce --set KEY=VALUE`: changes to a preset (`apply`).

Scalar and tuple fields of `Preset` by their type (tuples comma-separated), the string fields of
`_CHOICES` among their values, a model's integer sizes as `target.FIELD` / `draft.FIELD`, and the
premise pair's fields as `premise.FIELD` / `premise.target.FIELD` (`premise=none` drops the pair).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from gqa_spec.errors import UserError
from gqa_spec.reproduce.presets import PRETRAIN_TASKS, PremisePair, Preset

# Fields `--set` can change, by type; model configs and per-task dicts are not scalar knobs.
_SETTABLE = {f.name: f.type for f in dataclasses.fields(Preset)
             if f.type in ('int', 'float', 'bool', 'Tuple[int, ...]', 'Tuple[float, ...]',
                           'Tuple[int, int]', 'Optional[float]')}
# String fields `--set` can change, with their allowed values (`name` is not one: it is the preset).
_CHOICES = {'pretrain_task': PRETRAIN_TASKS, 'chimera_label_source': ('data', 'target')}
_SETTABLE.update({name: 'str' for name in _CHOICES})


# `--set target.FIELD=N` / `draft.FIELD=N`: a model's sizes (e.g. a tiny gpu preset for tests).
_MODELS = ('target', 'draft')
_MODEL_INTS = ('vocab_size', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim', 'num_encoder_layers',
               'num_decoder_layers')


def _parse(key: str, text: str, kind: str):
  def one(x: str, cast):
    try:
      return cast(x)
    except ValueError:
      kind_name = 'an integer' if cast is int else 'a number'
      raise UserError(f'--set {key}={text}: {x!r} is not {kind_name}') from None
  if kind == 'str':
    if text not in _CHOICES[key]:
      raise UserError(f'--set {key}={text}: expected one of {", ".join(_CHOICES[key])}')
    return text
  if kind == 'bool':
    if text.lower() not in ('true', 'false', '1', '0'):
      raise UserError(f'--set {key}={text}: expected true or false')
    return text.lower() in ('true', '1')
  if kind.startswith('Tuple'):
    cast = float if 'float' in kind else int
    values = tuple(one(x, cast) for x in text.split(',') if x.strip())
    if kind == 'Tuple[int, int]' and len(values) != 2:
      raise UserError(f'--set {key}={text}: expected two comma-separated integers')
    return values
  return one(text, float if 'float' in kind else int)


# `--set premise.FIELD=V` / `premise.target.FIELD=N` (a preset with a pair); `premise=none`.
_PREMISE_SETTABLE = {f.name: f.type for f in dataclasses.fields(PremisePair)
                     if f.type in ('int', 'float', 'Tuple[int, ...]')}


def _premise_override(preset: Preset, key: str, text: str, pair: Optional[PremisePair]):
  """The premise pair after one `--set premise...` assignment."""
  if key == 'premise':
    if text.lower() != 'none':
      raise UserError(f'--set premise={text}: expected none (its fields: premise.FIELD)')
    return None
  if pair is None:
    raise UserError(f'--set {key}: the {preset.name!r} preset has no premise pair')
  field = key[len('premise.'):]
  if field.startswith('target.') and field[len('target.'):] in _MODEL_INTS:
    try:
      return dataclasses.replace(pair, target=pair.target.replace(
          **{field[len('target.'):]: _parse(key, text, 'int')}))
    except ValueError as e:
      raise UserError(f'--set: {e}') from None
  if field not in _PREMISE_SETTABLE:
    raise UserError(f'--set {key}: not a settable premise field; settable: '
                    f'{", ".join(f"premise.{f}" for f in _PREMISE_SETTABLE)}, premise.target.*')
  return dataclasses.replace(pair, **{field: _parse(key, text, _PREMISE_SETTABLE[field])})


def apply(preset: Preset, assignments) -> Preset:
  """`preset` with `KEY=VALUE` assignments applied (tuples as comma-separated values).

  E.g. `apply(presets.get('cpu'), ['warmup_steps=10000', 'gammas=1,3,7', 'target.emb_dim=64'])`;
  `target.*` / `draft.*` set a model's integer sizes (`num_kv_heads` follows `num_heads` for MHA).
  """
  changes, models = {}, {}
  for item in assignments:
    key, sep, text = item.partition('=')
    key = key.strip()
    if not sep:
      raise UserError(f'--set {item!r}: expected KEY=VALUE')
    model, dot, field = key.partition('.')
    if model == 'premise':
      changes['premise'] = _premise_override(preset, key, text.strip(),
                                             changes.get('premise', preset.premise))
      continue
    if dot and model in _MODELS:
      if field not in _MODEL_INTS:
        raise UserError(f'--set {key}: not a settable model field; settable: '
                        f'{", ".join(f"{model}.{f}" for f in _MODEL_INTS)}')
      models.setdefault(model, {})[field] = _parse(key, text.strip(), 'int')
      continue
    if key not in _SETTABLE:
      raise UserError(f'--set {key}: not a settable preset field; settable: '
                      f'{", ".join(sorted(_SETTABLE))}')
    changes[key] = _parse(key, text.strip(), _SETTABLE[key])
  for model, fields in models.items():  # `target.*` also resizes the long-timing model
    if 'num_heads' in fields:  # the study's models are MHA
      fields['num_kv_heads'] = fields['num_heads']
    changes[model] = getattr(preset, model).replace(**fields)
    if model == 'target':
      changes['long_timing_config'] = preset.long_timing_config.replace(
          **{k: v for k, v in fields.items() if k != 'num_encoder_layers'})
  try:
    return dataclasses.replace(preset, **changes)
  except ValueError as e:  # a model config that cannot be built (T5Config's own checks)
    raise UserError(f'--set: {e}') from None
