"""Checkpoint formats: native orbax (`native`), HF transformers T5 (`hf`), T5X legacy
(`t5x_legacy`).

    config, params, vocab = native.load_checkpoint(ckpt_dir)
    native.save_checkpoint(ckpt_dir, config, params, vocab)
    config, params, vocab = hf.load_hf(hf_dir);  hf.save_hf(hf_dir, config, params, vocab)
    params = t5x_legacy.load_t5x(t5x_dir, config)
"""
