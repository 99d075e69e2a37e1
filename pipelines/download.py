"""Getting Multi30k EN–DE: the shared copy when present, else the public repository, checksummed."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request

from pipelines.sources import DataError

# multi30k/dataset @ a3d2e0d26b56f3846f66a952536ffed4e401d05a: data/task1/raw/*.gz
MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"
)
# SHA-256 of the decompressed files (as in ../shared/data/SHA256SUMS).
MULTI30K_SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
}


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _complete(directory: str, checksums: dict[str, str]) -> bool:
    return all(os.path.exists(os.path.join(directory, name)) for name in checksums)


def fetch_multi30k(
    destination: str = "data/multi30k",
    shared: str | None = "../shared/data/multi30k",
    base_url: str = MULTI30K_URL,
    checksums: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> str:
    """A directory with Multi30k's train/val/test_2016_flickr .en/.de files, verified.

    Uses ``shared`` in place when it holds the files (nothing is copied), else
    ``destination`` when a previous download completed, else downloads
    ``{base_url}/{name}.gz`` for each file, decompresses and checks SHA-256.
    Files are written to a temporary name and renamed, so an interrupted
    download leaves nothing half-written.
    """
    checksums = checksums or MULTI30K_SHA256
    if shared and _complete(shared, checksums):
        return shared
    if _complete(destination, checksums):
        return destination
    os.makedirs(destination, exist_ok=True)
    for name, expected in checksums.items():
        target = os.path.join(destination, name)
        if os.path.exists(target) and sha256(target) == expected:
            continue
        url = f"{base_url}/{name}.gz"
        handle, partial = tempfile.mkstemp(dir=destination, prefix=f".{name}.", suffix=".partial")
        os.close(handle)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
                with gzip.GzipFile(fileobj=response) as unzipped:
                    shutil.copyfileobj(unzipped, out)
            actual = sha256(partial)
            if actual != expected:
                raise DataError(f"{url}: SHA-256 {actual} does not match the expected {expected}")
            os.replace(partial, target)
        except (urllib.error.URLError, OSError, EOFError) as error:
            raise DataError(
                f"Could not download Multi30k ({url}): {error}.\n"
                f"This machine may be offline. Put the files {', '.join(checksums)} (UTF-8, one sentence per line) "
                f"in {destination} or {shared}, e.g. from the multi30k/dataset repository (data/task1/raw/*.gz, "
                "decompressed), and run again."
            ) from error
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return destination
