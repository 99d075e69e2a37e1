"""tf_transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras 3."""

from setuptools import find_packages, setup

# Pinned together and tested on Python 3.11 / x86_64. TF 2.21 no longer pulls in
# tensorboard, and the Keras TensorBoard callback fails without it.
INSTALL_REQUIRES = [
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "keras==3.15.1",
    "tensorboard==2.21.0",
    "tensorflow-datasets==4.9.10",
    "sentencepiece==0.2.3",
    "sacrebleu==2.6.0",
    # The Moses-tokenized BLEU of the Multi30k papers (tf_transformer/bleu.py): Moses' tokenizer, maintained port.
    "sacremoses==0.2.0",
    "absl-py>=2.1",
    "numpy>=1.26,<3",
    # Attention figures (tft-attention) and TensorBoard's attention images during training.
    "matplotlib==3.11.2",
    # Constituency parsing (section 6.3): Penn Treebank trees and Penn Treebank tokenization.
    "nltk==3.10.4",
    # tft-import: the weights of OPUS-MT models (model.safetensors), and Marian's own layout (YAML files).
    "safetensors==0.8.0",
    "pyyaml==6.0.4",
    # tft-serve: HTTP/1.1 (keep-alive, pipelining, chunked bodies) on one event loop, and the Prometheus metrics.
    "aiohttp>=3.9,<4",  # 3.9: AppRunner's graceful stop (shutdown_timeout)
    "prometheus-client==0.26.0",
    # tft-serve's gRPC API and model config file, and the export's warmup requests: TF Serving's own protos
    # (the release matching TensorFlow's), served on grpcio.
    "tensorflow-serving-api==2.21.0",
    "grpcio>=1.60,<2",
]

EXTRAS_REQUIRE = {
    "test": ["pytest>=8", "pytest-xdist==3.8.0", "ruff==0.17.6", "hypothesis==6.170.15"],
    # Other runtimes and reference implementations: tft-export --format ctranslate2 (docs/ctranslate2.md), and
    # what the slow tests compare with (the import's golden files, the CTranslate2 export); `make test-slow`
    # installs them, `make test` needs none of them.
    "reference": ["torch==2.13.0", "transformers==5.23.0", "ctranslate2==4.8.5"],
    # Peers for benchmarks/peers.py and the statistical aligner of benchmarks/alignment.py; never runtime
    # dependencies.
    "bench": [
        "keras-hub==0.32.0",
        "transformers==5.23.0",
        "torch==2.13.0",
        "ctranslate2==4.8.5",
        "tokenizers==0.23.3",
    ],
}

setup(
    name="tf_transformer",
    version="0.1.0",
    description='The Transformer of "Attention Is All You Need" for machine translation, in TensorFlow/Keras 3.',
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=find_packages(
        include=["tf_transformer", "tf_transformer.*", "pipelines", "pipelines.*", "configs", "configs.*"]
    ),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={
        "console_scripts": [
            "tft-model-info=tf_transformer.cli.model_info:run",
            "tft-train=tf_transformer.cli.train:run",
            "tft-average=tf_transformer.cli.average:run",
            "tft-export=tf_transformer.cli.export:run",
            "tft-translate=tf_transformer.cli.translate:run",
            "tft-serve=tf_transformer.cli.serve:run",
            "tft-evaluate=tf_transformer.cli.evaluate:run",
            "tft-attention=tf_transformer.cli.attention:run",
            "tft-parse=tf_transformer.cli.parse:run",
            "tft-score=tf_transformer.cli.score:run",
            "tft-import=tf_transformer.cli.import_model:run",
            "tft-distill=tf_transformer.cli.distill:run",
        ]
    },
    license="Apache-2.0",
)
