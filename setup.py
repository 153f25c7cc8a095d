"""Packaging beyond pyproject.toml: the gin configs ship inside the wheel as `gqa_spec/configs`.

The repository keeps them at the top level (`configs/`, t5x's layout); mapping that directory to
the package `gqa_spec.configs` puts them in every install, so `pip install .` users resolve
`--gin_file=experiments/...` and the configs' own includes with no `--gin_search_paths`
(`gqa_spec.training.gin_utils.CONFIGS_DIR` looks there first).
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=['gqa_spec', 'gqa_spec.*']) + ['gqa_spec.configs'],
    package_dir={'gqa_spec.configs': 'configs'},
    package_data={'gqa_spec': ['data/sample/*'], 'gqa_spec.configs': ['**/*.gin']},
)
