"""The package pages in headless Chromium (Debian's ``chromium`` through Playwright, as in
``test_browser.py``) against a real control plane (daphne) on a fresh SQLite: the family chart
draws a point per evaluated version, the gate's failure is readable, a job's progress moves
without a reload, Cancel works and a bad upload says why.

No control loop runs here, so the job rows stay as the tests write them (a loop would find
no process behind a "running" row and queue it again)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright import sync_api as playwright_sync  # noqa: E402

from tests.console.conftest import browser_marks, shot  # noqa: E402
from tests.support.processes import Proc, control_plane_at_home, manage_shell

pytestmark = browser_marks()

from tests.console.conftest import BROWSER_USERS_SETUP  # noqa: E402

# Family "smol": three evaluated versions (q8_0 and q5_k_m approved, q4_k_m rejected: below
# the accuracy floor and too far under the approved q5_k_m), one not evaluated; a build of
# q4_k_m running at 40 % and an evaluation of it queued.
SETUP = BROWSER_USERS_SETUP + (
    """
import hashlib
from inference.models import ModelPackage, PackageJob
from inference.packages.services import package_record_evaluation

def mode(share):
    return {"cases": 20, "tool_accuracy": share, "json_parse_rate": 1.0, "schema_valid_rate": 1.0,
            "name_accuracy": share, "args_exact": share, "abstention_accuracy": 1.0, "calls": 18}

def version(name, mib, accuracy=None, decode=None):
    package = ModelPackage.objects.create(
        name=name, version="1", family="smol", gguf_path="/nonexistent/" + name + ".gguf",
        sha256=hashlib.sha256(name.encode()).hexdigest(), size_bytes=mib * 2**20,
        quantization=name.rsplit("-", 1)[1].upper(), chat_template="{{ messages }}")
    if accuracy is not None:
        smoke = {"passed": True, "error": "", "steps": [{"name": "chat", "ok": True, "detail": ""}]}
        report = {"suite": {"version": 1}, "smoke": smoke,
                  "modes": {"grammar": mode(accuracy), "free": mode(accuracy / 2)},
                  "speed": {"ttft_ms": 80.0, "decode_tok_s": decode}, "perplexity": 12.0,
                  "cases": [], "seconds": 30.0}
        package_record_evaluation(package_id=package.pk, report=report)
    return package

version("smol-q8_0", 140, 0.80, 30.0)
version("smol-q5_k_m", 100, 0.78, 38.0)
rejected = version("smol-q4_k_m", 85, 0.31, 45.0)
version("smol-q2_k", 60)
PackageJob.objects.create(kind="build", package=rejected, state="running", progress=0.4,
                          message="quantizing", params={"quantization": "Q3_K_M"})
PackageJob.objects.create(kind="evaluate", package=rejected, params={"subset": 5})
"""
)


@dataclass
class Array:
    url: str
    token: str
    env: dict[str, str]
    procs: list[Proc]

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, f"{self.url}/api{path}", headers=headers, timeout=10, **kwargs)

    def shell(self, code: str) -> None:
        """Run ``code`` in ``manage.py shell`` on this control plane's database."""
        manage_shell(self.env, code)

    def package_id(self, key: str) -> int:
        return next(p["id"] for p in self.api("GET", "/packages").json() if p["key"] == key)

    def job_id(self, kind: str) -> int:
        return next(j["id"] for j in self.api("GET", "/packages/jobs").json() if j["kind"] == kind)


@pytest.fixture(scope="module")
def array(tmp_path_factory) -> Iterator[Array]:
    """daphne on a fresh SQLite under a temporary PHALANX_HOME, with the family above."""
    home = tmp_path_factory.mktemp("phalanx-home")
    daphne, token, extra = control_plane_at_home(home, setup=SETUP)
    try:
        yield Array(url=daphne.url, token=token, env=extra, procs=[daphne])
    finally:
        daphne.stop()


# Markers Plotly has drawn in the family chart (what a person sees), and their labels.
DRAWN_POINTS = "() => document.querySelectorAll('#family-chart .scatterlayer .point').length"
POINT_LABELS = """() => [...document.querySelectorAll('#family-chart .scatterlayer .textpoint')]
    .map(t => t.textContent).sort()"""


def test_the_version_page_draws_the_family_and_shows_why_the_gate_failed(page_as, array):
    page = page_as("viewer")
    page.goto(f"{array.url}/packages/{array.package_id('smol-q4_k_m:1')}/")
    page.wait_for_function(f"({DRAWN_POINTS})() > 0")
    assert page.evaluate(DRAWN_POINTS) == 3  # the three evaluated versions; q2_k was not
    assert page.evaluate(POINT_LABELS) == ["smol-q4_k_m:1", "smol-q5_k_m:1", "smol-q8_0:1"]
    criteria = page.locator("#gate-criteria")
    failed = criteria.get_by_role("row", name="tool_accuracy ✗ fail tool_accuracy 0.31 < 0.50")
    playwright_sync.expect(failed).to_be_visible()
    regression = criteria.get_by_role("row").filter(has_text="regression")
    playwright_sync.expect(regression.get_by_role("cell").nth(1)).to_have_text("✗ fail")
    playwright_sync.expect(regression.get_by_role("cell").nth(2)).to_have_text(
        "tool accuracy 0.31 against the approved 0.78 (more than the allowed drop of 0.05)"
    )
    playwright_sync.expect(page.locator("#package-status")).to_have_text("rejected")
    shot(page, "package-version")


def test_a_running_jobs_progress_moves_without_a_reload(page_as, array):
    page = page_as("operator")
    page.goto(f"{array.url}/packages/{array.package_id('smol-q4_k_m:1')}/")
    job = array.job_id("build")
    percent = page.locator(f'tr[data-job="{job}"] [data-field=percent]')
    playwright_sync.expect(percent).to_have_text("40%")
    page.evaluate("window.notReloaded = true")
    array.shell(
        f"from inference.models import PackageJob\n"
        f"PackageJob.objects.filter(pk={job}).update(progress=0.75, message='writing the file')"
    )
    playwright_sync.expect(percent).to_have_text("75%", timeout=15_000)
    row = page.locator(f'tr[data-job="{job}"]')
    playwright_sync.expect(row).to_contain_text("writing the file")
    assert row.locator("progress").evaluate("bar => bar.value") == 75
    array.shell(
        f"from inference.models import PackageJob\n"
        f"PackageJob.objects.filter(pk={job}).update(state='failed', error='out of disk')"
    )
    playwright_sync.expect(row.locator("[data-field=state]")).to_have_text("failed")
    playwright_sync.expect(row).to_contain_text("out of disk")
    playwright_sync.expect(row.locator("[data-action=cancel-job]")).to_have_count(0)
    assert page.evaluate("window.notReloaded") is True
    shot(page, "package-jobs")


def test_a_finished_job_links_to_what_it_made_and_every_size_reads_mib(page_as, array):
    """Mid-run the log shows the steps so far; at the end the row links to the version it made
    (it said "reload to see what it made"); sizes read MiB on every page (issue 28)."""
    page = page_as("operator")
    source = array.package_id("smol-q5_k_m:1")
    array.shell(
        "from inference.models import ModelPackage, PackageJob\n"
        f"PackageJob.objects.create(kind='build', package_id={source}, state='running', "
        "progress=0.26, message='quantizing', params={'quantization': 'Q3_K_M'}, "
        "log='reading smol-q5_k_m:1\\nquantizing')"
    )
    job = max(j["id"] for j in array.api("GET", "/packages/jobs").json() if j["kind"] == "build")
    page.goto(f"{array.url}/packages/{source}/")
    playwright_sync.expect(page.locator("#job-log")).to_have_text(
        "reading smol-q5_k_m:1\nquantizing"
    )
    array.shell(
        "from inference.models import ModelPackage, PackageJob\n"
        "made = ModelPackage.objects.create(name='smol-q3_k_m', version='1', family='smol', "
        "gguf_path='/nonexistent/q3.gguf', sha256='3' * 64, size_bytes=70 * 2**20, "
        "quantization='Q3_K_M')\n"
        f"PackageJob.objects.filter(pk={job}).update(state='succeeded', progress=1.0, "
        "output=made, message='built smol-q3_k_m-1.gguf: Q3_K_M, 70.0 MiB')"
    )
    made = page.locator(f'tr[data-job="{job}"] [data-field=made]')
    playwright_sync.expect(made).to_have_text("made smol-q3_k_m:1", timeout=15_000)
    made.click()
    playwright_sync.expect(page.locator("h1")).to_contain_text("smol-q3_k_m")
    playwright_sync.expect(page.locator("#package-facts")).to_contain_text(
        f"70.0 MiB ({70 * 2**20} bytes)"
    )
    page.goto(f"{array.url}/packages/")
    row = page.locator("tr", has_text="smol-q5_k_m:1").first
    playwright_sync.expect(row).to_contain_text("100.0 MiB")


def test_an_operator_cancels_a_queued_job(page_as, array):
    page = page_as("operator")
    page.goto(f"{array.url}/packages/")
    job = array.job_id("evaluate")
    row = page.locator(f'tr[data-job="{job}"]')
    playwright_sync.expect(row.locator("[data-field=state]")).to_have_text("queued")
    row.locator("[data-action=cancel-job]").click()
    playwright_sync.expect(row.locator("[data-field=state]")).to_have_text("cancelled")
    assert array.api("GET", f"/packages/jobs/{job}").json()["state"] == "cancelled"


def test_uploading_a_file_that_is_not_gguf_says_why(page_as, array):
    page = page_as("admin")
    page.goto(f"{array.url}/packages/")
    page.set_input_files(
        "#id_upload-file",
        files=[
            {
                "name": "notes.gguf",
                "mimeType": "application/octet-stream",
                "buffer": b"PK\x03\x04zip",
            }
        ],
    )
    playwright_sync.expect(page.locator("#id_upload-name")).to_have_value("notes")
    page.click("#upload-button")
    error = page.locator("#upload-error")
    playwright_sync.expect(error).to_contain_text(
        "notes.gguf is not a GGUF file: it starts with b'PK\\x03\\x04'"
    )
    assert not any(p["name"] == "notes" for p in array.api("GET", "/packages").json())
    shot(page, "packages")


@pytest.mark.model
def test_uploading_a_gguf_shows_its_progress_and_opens_its_version_page(page_as, array):
    from tests.support.processes import bundled_model_path

    page = page_as("admin")
    page.goto(f"{array.url}/packages/")
    page.set_input_files("#id_upload-file", str(bundled_model_path()))
    page.fill("#id_upload-name", "smol-uploaded")
    page.click("#upload-button")
    playwright_sync.expect(page.locator("#upload-status")).to_contain_text("MiB sent")
    page.wait_for_url(re.compile(r"/packages/\d+/$"), timeout=120_000)
    assert page.url == f"{array.url}/packages/{array.package_id('smol-uploaded:1')}/"
    playwright_sync.expect(page.locator("h1")).to_have_text("smol-uploaded 1")
    playwright_sync.expect(page.locator("#lineage")).to_contain_text("upload ")
    playwright_sync.expect(page.locator("#package-facts")).to_contain_text("llama")
