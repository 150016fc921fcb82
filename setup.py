"""Package layout (metadata lives in pyproject.toml).

``src/rlgate`` is the library; ``examples/`` is installed as the package
``rlgate_examples`` so that the demo can import the example agents from any install.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages("src") + ["rlgate_examples"],
    package_dir={"": "src", "rlgate_examples": "examples"},
)
