"""The pictures in the README and docs/, made from real runs by the commands a user types.

    python benchmarks/pictures.py --run outputs/runs/<stamp> --sft outputs/runs/<sft stamp> \
        [--sweep outputs/sweeps/<stamp>] [--out docs/img]

--run is the quickstart's run (`python train.py`), --sft the chat run finetuned from it (the
README's `tinygpt train experiment=sft ...`), --sweep a finished sweep. It writes:

    quickstart-curves.png      tinygpt plot run_dir=<run> out=...
    quickstart-attention.png   tinygpt plot run_dir=<run> attention="ROMEO: But soft, what light" layers=[0,3] out=...
    playground.png             the playground (tinygpt serve) completing "ROMEO:" with the quickstart's model
    playground-chat.png        its chat mode with the chat run: two questions, greedy
    sweep-val-curves.png       the sweep's val_curves.png (tinygpt sweep <dir> writes it)

The screenshots need Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)
and selenium; the server runs on a free port on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = ["What is 47 + 38?", "Spell 'stone' letter by letter."]


def tinygpt(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gpt", *args], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser():
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")))


def screenshots(run: Path, sft: Path, out: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [sys.executable, "-m", "gpt", "serve", f"port={port}", f"models=[{run},{sft}]"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        b = browser()
        try:
            b.get(url + "/")
            WebDriverWait(b, 30).until(lambda d: len(Select(d.find_element(By.ID, "model")).options) == 2)
            slider = (
                "const e = document.getElementById(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event('input'));"
            )
            models = Select(b.find_element(By.ID, "model"))
            models.select_by_index(0)
            b.execute_script("document.getElementById('model').dispatchEvent(new Event('change'))")
            b.execute_script(slider, "max_tokens", "200")
            b.find_element(By.ID, "prompt").send_keys("ROMEO:")
            b.find_element(By.ID, "generate").click()
            WebDriverWait(b, 120).until(lambda d: d.find_element(By.ID, "status").text.startswith("done"))
            b.save_screenshot(str(out / "playground.png"))
            models.select_by_index(1)
            b.execute_script("document.getElementById('model').dispatchEvent(new Event('change'))")
            b.execute_script(slider, "temperature", "0")
            for question in QUESTIONS:
                b.find_element(By.ID, "message").send_keys(question)
                b.find_element(By.ID, "send").click()
                WebDriverWait(b, 120).until(lambda d: d.find_element(By.ID, "status").text.startswith("done"))
            b.save_screenshot(str(out / "playground-chat.png"))
        finally:
            b.quit()
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the quickstart's run directory")
    parser.add_argument("--sft", type=Path, required=True, help="the chat run finetuned from it")
    parser.add_argument("--sweep", type=Path, help="a finished sweep's folder")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tinygpt("plot", f"run_dir={args.run}", f"out={args.out / 'quickstart-curves.png'}")
    tinygpt(
        "plot",
        f"run_dir={args.run}",
        "attention=ROMEO: But soft, what light",
        "layers=[0,3]",
        f"out={args.out / 'quickstart-attention.png'}",
    )
    screenshots(args.run.resolve(), args.sft.resolve(), args.out)
    if args.sweep:
        tinygpt("sweep", str(args.sweep))
        shutil.copyfile(args.sweep / "val_curves.png", args.out / "sweep-val-curves.png")
    print(f"wrote the pictures to {args.out}")


if __name__ == "__main__":
    main()
