"""Installation of verl: `pip install -e .` (add `[test]` for the test suite, `[vllm]` on GPU)."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_requirements(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


extras = {
    # vLLM needs a CUDA GPU; it is only used by `actor_rollout_ref.rollout.name=vllm`.
    "vllm": ["vllm>=0.8"],
    "test": ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100"],
    "math": ["math-verify>=0.7"],
}
extras["dev"] = extras["test"] + ["ruff>=0.6"]

setup(
    name="verl",
    version="0.1.0",
    description="HybridFlow-style single-controller reinforcement learning for language models",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["verl", "verl.*"]),
    include_package_data=True,
    package_data={"verl": ["trainer/config/*.yaml", "trainer/config/**/*.yaml", "assets/**/*"]},
    python_requires=">=3.10",
    install_requires=read_requirements("requirements.txt"),
    extras_require=extras,
)
