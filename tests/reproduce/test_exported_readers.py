"""The reproduction's own data readers (baselines, speculative inputs, the n-gram draft's fit) read
an exported task exactly as they read the registered seqio task it was exported from."""

import numpy as np

from gqa_spec.data import export, tasks
from gqa_spec.decoding.drafts.ngram import fit_ngram_on_task
from gqa_spec.reproduce import baselines, presets, speculation

LENGTHS = {'inputs': 32, 'targets': 16}


def test_exported_tasks_read_as_their_seqio_tasks(tiny_data_dir, tmp_path):
  tasks.register_ddtp_tasks(tiny_data_dir)
  try:
    out = str(tmp_path)
    # At the seqio defaults' lengths (512/256 covers translate's 256/256): the n-gram fit reads
    # the targets untrimmed by either path.
    export.export([presets.MULTITASK], out, splits=('train', 'test'),
                  lengths={'inputs': 512, 'targets': 256})
    for name in (presets.TRANSLATE, presets.SUMMARIZE):
      exported = f'exported:{out}/{name}'
      assert (baselines.task_examples(exported, 'test', LENGTHS, 5)
              == baselines.task_examples(name, 'test', LENGTHS, 5))
      np.testing.assert_array_equal(speculation._test_inputs(exported, (32, 16), 3),
                                    speculation._test_inputs(name, (32, 16), 3))
    exported = f'exported:{out}/{presets.SUMMARIZE}'
    assert (baselines._train_targets(exported)
            == baselines._train_targets(presets.SUMMARIZE))
    a = fit_ngram_on_task(f'exported:{out}/{presets.TRANSLATE}', 2)
    b = fit_ngram_on_task(presets.TRANSLATE, 2)
    assert a.vocab_size == b.vocab_size and a.bigram == b.bigram and a.bigram
    np.testing.assert_array_equal(a.unigram, b.unigram)
  finally:
    tasks.register_ddtp_tasks()  # back to the default data dir for other modules
