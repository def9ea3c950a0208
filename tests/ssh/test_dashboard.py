"""`clusterctl dashboard` in a real headless browser (Debian's chromium, driven by selenium through chromium-driver):
the page of a 2-host run of the bundled trainer while it runs (the hosts' telemetry, the run's per-rank curves
growing between two screenshots, "finished" at its end), a serve endpoint's chat box answering through the
dashboard, and the page refused (403) without the URL's token.

Without chromium and its driver the tests are skipped with a line saying what to install; tests/run.sh installs
both and sets CLUSTERCTL_REQUIRE_BROWSER=1, under which a missing browser fails instead (CI must run them).
CLUSTERCTL_DOCS_IMAGES=1 writes the second screenshot to docs/images/dashboard.png (docs/observe.md shows it)."""
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request

import clirun
import pytest

pytestmark = pytest.mark.ssh

URL = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/\?token=\S+)")
DOCS_IMAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "images", "dashboard.png")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser():
    """A headless chromium, or a skip (a failure under CLUSTERCTL_REQUIRE_BROWSER) naming what is missing."""
    missing = [name for name, found in (("chromium", shutil.which("chromium") or shutil.which("chromium-browser")),
                                        ("chromium-driver", os.path.exists(CHROMEDRIVER)))
               if not found]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        why = f"no browser for the dashboard's tests: install {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CLUSTERCTL_REQUIRE_BROWSER"):
            pytest.fail(why)
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1400",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def browser():
    driver = _browser()
    yield driver
    driver.quit()


class Dashboard:
    """`clusterctl dashboard` running in the background; its URL read from its output."""

    def __init__(self, *args, cwd, env):
        self.proc = clirun.start("dashboard", *args, cwd=cwd, env=env, own_cache=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_url()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _wait_url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [m for m in map(URL.search, list(self.lines)) if m]
            if found:
                return found[0].group(1)
            assert self.proc.poll() is None, "\n".join(self.lines)
            time.sleep(0.1)
        raise AssertionError("no URL printed:\n" + "\n".join(self.lines))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def wait(what, timeout: float, why, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(why())


def text(driver, css: str) -> str:
    """The text of the first element `css` selects ("" for none), read in one step in the page: the page replaces
    its rows as it updates, so an element found first and read after may be gone."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css)


def texts(driver, css: str) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText);", css)


def test_a_two_host_run_appears_live_its_curves_grow_and_it_ends_finished(make_cluster, browser, tmp_path):
    cluster = make_cluster(2)
    env = cluster.client_env()
    board = Dashboard("--hosts", str(cluster.inventory), "--interval", "1", cwd=tmp_path, env=env)
    run = None
    try:
        base, token = board.url.split("?token=")
        assert status_of(base) == 403 and status_of(base + "api/overview") == 403
        assert status_of(base + "api/overview?token=" + "x" * len(token)) == 403
        assert status_of(board.url) == 200
        browser.get(board.url)
        # the hosts, sampled from their own tools, before any run
        wait(lambda: text(browser, "#hosts tbody tr[data-host='h2']").split()[1:2] == ["ok"], 30,
             lambda: f"h2 not sampled: {text(browser, '#hosts')!r}")
        run = clirun.start("run", "--hosts", str(cluster.inventory), "--plain", "--", "--steps", "80",
                           "--report-every", "2", cwd=tmp_path, env=env, own_cache=True)
        run_id = wait(lambda: texts(browser, "#runs tbody tr[data-run-id]") and
                      text(browser, "#run-status") == "running" and text(browser, "#run-id"), 90,
                      lambda: f"no running run shown: {text(browser, '#run-section')!r}")
        chart = lambda: int(browser.find_element("id", "loss-chart").get_attribute("data-points"))  # noqa: E731
        wait(lambda: chart() >= 4, 90, lambda: f"no curve: {text(browser, '#run-section')!r}")
        first_points, first = chart(), browser.get_screenshot_as_png()
        wait(lambda: chart() >= first_points + 4, 60, lambda: f"the curve did not grow past {first_points} points")
        second_points, second = chart(), browser.get_screenshot_as_png()
        assert second != first and second_points > first_points
        ranks = texts(browser, "#ranks tbody tr")
        assert [r.split()[:2] for r in ranks] == [["0", "h1"], ["1", "h2"]], ranks
        if os.environ.get("CLUSTERCTL_DOCS_IMAGES"):
            with open(DOCS_IMAGE, "wb") as f:
                f.write(second)
        assert run.wait(180) == 0, run.stdout.read()[-3000:]
        wait(lambda: text(browser, "#run-status") == "finished", 30,
             lambda: f"not finished: {text(browser, '#run-section')!r}")
        assert text(browser, "#run-id") == run_id
        # the runs table comes with the overview, which the stream sends apart from the run it follows: it may
        # say "finished" an update after the run's own status does
        row = lambda: text(browser, f"#runs tbody tr[data-run-id='{run_id}']")  # noqa: E731
        wait(lambda: "finished" in row(), 30, lambda: f"the runs table: {row()!r}")
        assert "finished" in row() and "train" in row(), row()
        # the held-out loss came through too (the trainer evaluates at the end): a curve of its own
        assert "held-out" in text(browser, "#loss-chart")
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.wait(30)
        board.stop()
    assert board.proc.returncode is not None


def test_the_chat_box_talks_to_a_serve_endpoint_through_the_dashboard(make_cluster, browser, tmp_path):
    pytest.importorskip("mlx_lm")
    import lmfixture
    from sshcluster import free_port
    from test_serve_cluster import Served

    from selenium.webdriver.common.keys import Keys

    model = lmfixture.make_model(tmp_path / "models" / "tiny")
    cluster = make_cluster(1, inventory_only=True)
    env = cluster.client_env()
    served = Served(str(model), "--hosts", str(cluster.inventory), "--port", str(free_port("127.0.0.1")), cwd=tmp_path,
                    env=env)
    board = None
    try:
        url, model_id = served.ready().groups()
        board = Dashboard(cwd=tmp_path, env=env)           # no inventory: runs and endpoints only
        browser.get(board.url)
        row = wait(lambda: text(browser, "#endpoints tbody tr"), 30, lambda: f"no endpoint: {text(browser, 'main')!r}")
        assert url in row and model_id in row
        wait(lambda: "healthy" in text(browser, "#endpoints tbody tr"), 30,
             lambda: f"not healthy: {text(browser, '#endpoints')!r}")
        box = browser.find_element("id", "chat-input")
        box.send_keys("Tom found a", Keys.ENTER)
        wait(lambda: texts(browser, "#chat-log p.assistant, #chat-log p.error") != [], 120,
             lambda: f"no answer: {text(browser, '#chat-log')!r}")
        assert texts(browser, "#chat-log p.error") == [] and len(texts(browser, "#chat-log p.assistant")) == 1, \
            text(browser, "#chat-log")
        assert text(browser, "#chat-log p.user") == "Tom found a"
        assert not browser.find_elements("id", "hosts") or not browser.find_element("id", "hosts").is_displayed()
    finally:
        if board is not None:
            board.stop()
        assert served.interrupt() == 130, served.text[-3000:]
        served.kill()
