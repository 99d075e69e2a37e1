"""``tft-train`` that sends itself SIGTERM at its first validation batch (a test harness, run as a worker).

    python -m tests.training.signal_in_validation tft-train flags…

Wraps the multi-worker loop's validation so that, before the workers' first
agreement in it, this process receives SIGTERM: the signal arrives while the
epoch's validation runs, as a preemption would.
"""

import os
import signal
import sys

from tf_transformer.training import multi_worker


def main() -> None:
    evaluation = multi_worker._evaluation

    def signalled(model, validation, agree, requests):
        sent = []

        def agree_after_a_signal():
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)
            agree()

        return evaluation(model, validation, agree_after_a_signal, requests)

    multi_worker._evaluation = signalled
    from tf_transformer.cli.train import run

    sys.argv = ["tft-train", *sys.argv[1:]]
    run()


if __name__ == "__main__":
    main()
