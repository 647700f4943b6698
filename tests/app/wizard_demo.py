"""Run the model wizard against the fake Hub in a real terminal: `python -m tests.app.wizard_demo [HF_HOME]`.

With `--serve`, only the fake Hub runs (it prints its HF_ENDPOINT) for trying `localchat download`.

For the smoke test in tmux. The fake Hub streams slowly so progress and cancel can be watched.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

from tests.hub_server import FakeHub, FakeRepo


def main() -> None:
    from tests.hub_fixtures import tiny_eagle3_files, tiny_llama_files

    hub = FakeHub(rate_bytes_per_s=float(os.environ.get("FAKE_HUB_RATE", 150_000)))
    hub.add(FakeRepo("tiny/llama", tiny_llama_files(hidden=128, inter=384, layers=4)))
    hub.add(FakeRepo("tiny/gated-llama", tiny_llama_files(seed=3), gated=True))
    hub.add(FakeRepo("tiny/llama-eagle3", tiny_eagle3_files(hidden=128, inter=384)))
    hub.add(FakeRepo("tiny/wide-eagle3", tiny_eagle3_files(hidden=96)))
    hub.start()
    if "--serve" in sys.argv:  # only the fake Hub, for trying the CLI against it
        print(f"HF_ENDPOINT={hub.url}", flush=True)
        threading.Event().wait()
    home = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="wizard-demo-")
    os.environ["HF_ENDPOINT"] = hub.url  # before huggingface_hub is imported
    os.environ["HF_HOME"] = home
    os.environ.pop("HF_TOKEN", None)
    print(f"fake Hub at {hub.url}, HF_HOME={home}, token for gated repos: {hub.token}", file=sys.stderr)

    from textual.app import App

    from app.screens.wizard import WizardScreen

    class WizardApp(App):
        result = None

        def on_mount(self) -> None:
            self.push_screen(WizardScreen(), self.done)

        def done(self, result) -> None:
            self.exit(result)

    print("wizard result:", WizardApp().run())
    hub.stop()


if __name__ == "__main__":
    main()
