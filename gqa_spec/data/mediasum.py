"""MediaSum (Zhu et al. 2021): interview transcripts -> summaries, read from local JSONL files.

MediaSum is not in TFDS. Its release (github.com/zcgzcgzcg1/MediaSum) is `news_dialogue.json`, a
JSON list of interviews `{"id", "program", "date", "url", "title", "summary", "utt": [...],
"speaker": [...]}`, and `train_val_test_split.json`, `{"train": [ids], "val": [ids], "test": [ids]}`.
`convert` turns them into the layout this source reads:

  <dir>/train.jsonl, validation.jsonl, test.jsonl     one interview per line (fields as above)

with `<dir>` = `$GQA_SPEC_MEDIASUM_DIR`, else `~/.cache/gqa_spec/mediasum`.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import seqio
import tensorflow as tf

from gqa_spec import atomic
from gqa_spec.errors import UserError

SPLITS = ('train', 'validation', 'test')
_RELEASE_SPLITS = {'train': 'train', 'val': 'validation', 'test': 'test'}


def default_dir() -> str:
  return os.environ.get('GQA_SPEC_MEDIASUM_DIR') or os.path.join(
      os.path.expanduser('~'), '.cache', 'gqa_spec', 'mediasum')


def convert(dialogue_json: str, split_json: str, output_dir: str) -> Dict[str, int]:
  """Writes the release's interviews to `<output_dir>/<split>.jsonl`; returns the split sizes."""
  with open(dialogue_json) as f:
    interviews = {d['id']: d for d in json.load(f)}
  with open(split_json) as f:
    split_ids = json.load(f)
  os.makedirs(output_dir, exist_ok=True)
  sizes = {}
  for release_name, split in _RELEASE_SPLITS.items():
    ids = [i for i in split_ids.get(release_name, []) if i in interviews]
    with atomic.open_for_write(os.path.join(output_dir, f'{split}.jsonl')) as f:
      for i in ids:
        f.write(json.dumps(interviews[i], ensure_ascii=False) + '\n')
    sizes[split] = len(ids)
  return sizes


def source(directory: Optional[str] = None) -> seqio.FunctionDataSource:
  """A seqio source of `{'id', 'summary', 'utt': [turns], 'speaker': [turns]}` examples."""
  directory = directory or default_dir()

  def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None) -> tf.data.Dataset:
    del shuffle_files, seed
    path = os.path.join(directory, f'{split}.jsonl')
    if not os.path.exists(path):
      raise UserError(f'no MediaSum file {path}; download the release and run '
                      '`gqa_spec.data.mediasum.convert` (see its docstring)')

    def examples():
      with open(path, encoding='utf-8') as f:
        for line in f:
          if line.strip():
            d = json.loads(line)
            yield {'id': str(d['id']), 'summary': d['summary'],
                   'utt': d['utt'], 'speaker': d['speaker']}

    return tf.data.Dataset.from_generator(examples, output_signature={
        'id': tf.TensorSpec([], tf.string), 'summary': tf.TensorSpec([], tf.string),
        'utt': tf.TensorSpec([None], tf.string), 'speaker': tf.TensorSpec([None], tf.string)})

  return seqio.FunctionDataSource(dataset_fn, splits=SPLITS)
