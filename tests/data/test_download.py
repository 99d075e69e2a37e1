"""Getting Multi30k: shared copy in place, else a checksummed download (tested on a local server)."""

import functools
import gzip
import hashlib
import http.server
import threading

import pytest

from pipelines import DataError
from pipelines.download import fetch_multi30k

FILES = {"train.en": "A dog.\nTwo cats.\n", "train.de": "Ein Hund.\nZwei Katzen.\n"}
CHECKSUMS = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in FILES.items()}


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    for name, text in FILES.items():
        (root / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


def test_downloads_decompresses_and_verifies(tmp_path, server):
    url, _ = server
    destination = tmp_path / "data"
    path = fetch_multi30k(str(destination), shared=str(tmp_path / "absent"), base_url=url, checksums=CHECKSUMS)
    assert path == str(destination)
    assert {p.name for p in destination.iterdir()} == set(FILES)
    assert (destination / "train.de").read_text() == FILES["train.de"]
    # A second call finds the complete download and does not fetch again.
    assert fetch_multi30k(str(destination), shared=None, base_url="http://127.0.0.1:9", checksums=CHECKSUMS) == str(
        destination
    )


def test_shared_copy_is_used_in_place(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    for name, text in FILES.items():
        (shared / name).write_text(text)
    assert fetch_multi30k(str(tmp_path / "d"), shared=str(shared), checksums=CHECKSUMS) == str(shared)
    assert not (tmp_path / "d").exists()


def test_checksum_mismatch_leaves_nothing(tmp_path, server):
    url, root = server
    (root / "train.de.gz").write_bytes(gzip.compress(b"tampered\n"))
    destination = tmp_path / "data"
    with pytest.raises(DataError, match="SHA-256"):
        fetch_multi30k(str(destination), shared=None, base_url=url, checksums=CHECKSUMS)
    assert not (destination / "train.de").exists()
    assert not [p for p in destination.iterdir() if p.name.startswith(".")]


def test_offline_and_absent_says_what_to_do(tmp_path):
    with pytest.raises(DataError, match="(?s)offline.*train.en.*run again"):
        fetch_multi30k(str(tmp_path / "d"), shared=None, base_url="http://127.0.0.1:9", checksums=CHECKSUMS, timeout=5)
