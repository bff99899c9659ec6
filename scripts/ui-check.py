#!/usr/bin/env python3
"""Tests the dashboard at /ui in a real headless browser (Debian's chromium and
chromium-driver, driven by Selenium) against a real node (CTXPOD_BIN) with tokens on:

1. the page asks for a token, and with a `viewer` token shows the pod: one node up, its
   capacity, no blocks yet;
2. the test writes blocks and reads them back through the API (admin token); the page's
   live numbers follow (blocks, used, hit ratio, bandwidth, p99, the namespace's usage)
   without a reload;
3. the miss-ratio curve is drawn (48 points, not flat) and the bandwidth chart too;
4. the planner form returns exactly the numbers of `ctxpod plan --json` for the same
   inputs, for two models; with the live curve it draws the curve it planned from, and with
   a fast tier it gives the fast tier its share of the hits;
5. dark and light both render (the background changes), a screenshot of each is saved
   (CTXPOD_ARTIFACTS, default $CARGO_TARGET_DIR/ui-artifacts);
6. the browser's console has no error or warning from the page, at any point up to here;
7. a tenant's token is turned away with a clear message (after the console check: the
   refused request is logged by the browser, as it should be).

Every wait is bounded (WAIT_S). Exits non-zero on the first failure; stops the node.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

BIN = os.environ.get("CTXPOD_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", "target"), "debug", "ctxpod"
)
ARTIFACTS = os.environ.get("CTXPOD_ARTIFACTS") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", "target"), "ui-artifacts"
)
WAIT_S = 30
BLOCKS = 200
BLOCK_BYTES = 64 * 1024


def fail(msg):
    print(f"ui-check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, f, timeout=WAIT_S):
    """f() until it returns something truthy; fails after `timeout` seconds."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = f()
            if v:
                return v
        except Exception as e:  # an element not there yet, a node not up yet
            last = e
        time.sleep(0.2)
    fail(f"timed out waiting for {what} (last error: {last})")


def token(tmp, tid, role, tenant=None):
    args = [BIN, "token", "create", "--id", tid, "--role", role, "--dir", f"{tmp}/tokens"]
    if tenant:
        args += ["--tenant", tenant]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def call(base, tok, method, path, body=None):
    req = urllib.request.Request(base + path, data=body, method=method)
    req.add_header("Authorization", "Bearer " + tok)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def cli_plan(args):
    out = subprocess.run([BIN, "plan", "--json", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,2600", "--force-prefers-reduced-motion"]:
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(options=o, service=Service(executable_path=drv))


def main():
    if not os.access(BIN, os.X_OK):
        fail(f"no ctxpod binary at {BIN} (set CTXPOD_BIN)")
    os.makedirs(ARTIFACTS, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ctxpod-ui-")
    port = free_port()
    admin = token(tmp, "admin", "admin")
    viewer = token(tmp, "viewer", "viewer")
    tenant = token(tmp, "acme-ro", "tenant-ro", "acme")
    with open(f"{tmp}/node.toml", "w") as f:
        f.write(
            f'data_dir = "{tmp}/data"\nlisten = "127.0.0.1:{port}"\n'
            f'transfer_listen = "127.0.0.1:{free_port()}"\ncapacity = "256MiB"\n'
            'dram = "8MiB"\nmrc_sample_rate = 1.0\nlog = "warn"\n'
            f'[auth]\ntokens_dir = "{tmp}/tokens"\n'
        )
    base = f"http://127.0.0.1:{port}"
    node = subprocess.Popen([BIN, "serve", "--config", f"{tmp}/node.toml"],
                            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/node.log", "w"))
    driver = None
    try:
        wait_for("the node", lambda: urllib.request.urlopen(base + "/readyz", timeout=2).status == 200)
        driver = browser()
        check(driver, base, admin, viewer, tenant)
    finally:
        if driver is not None:
            driver.quit()
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=20)
        except subprocess.TimeoutExpired:
            node.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"ui-check: ok (screenshots in {ARTIFACTS})")


def text(d, css):
    return d.find_element(By.CSS_SELECTOR, css).text


def check(d, base, admin, viewer, tenant):
    # 1. The page asks for a token; a viewer's opens it.
    d.get(base + "/ui?refresh=500")
    wait_for("the token form", lambda: d.find_element(By.ID, "login").is_displayed())
    d.find_element(By.ID, "token").send_keys(viewer)
    d.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait_for("one node up", lambda: text(d, "#m-nodes") == "1 / 1")
    if text(d, "#m-blocks") != "0":
        fail(f"blocks before any write: {text(d, '#m-blocks')}")
    if text(d, "#m-capacity") != "268 MB":
        fail(f"capacity shown: {text(d, '#m-capacity')!r}")
    used_before = text(d, "#m-used")

    # 2. Writes and reads through the API; the page follows.
    for i in range(BLOCKS):
        body = (i.to_bytes(4, "big") * (BLOCK_BYTES // 4))
        s, b = call(base, admin, "PUT", f"/v1/namespaces/default/blocks/{i:08x}", body)
        if s not in (200, 201):
            fail(f"PUT {i}: {s} {b[:200]!r}")
    for i in range(BLOCKS):
        s, b = call(base, admin, "GET", f"/v1/namespaces/default/blocks/{i:08x}")
        if s != 200 or b[:4] != i.to_bytes(4, "big"):
            fail(f"GET {i}: {s}")
    for i in range(20):
        s, _ = call(base, admin, "GET", f"/v1/namespaces/default/blocks/ff{i:06x}")
        if s != 404:
            fail(f"GET of a missing block: {s}")
    wait_for("the blocks counted", lambda: text(d, "#m-blocks") == f"{BLOCKS}")
    wait_for("the used bytes to change", lambda: text(d, "#m-used") != used_before)
    # 200 hits and 20 misses since the start.
    wait_for("the hit ratio", lambda: text(d, "#m-hit").endswith(" / 0.909"))
    ns = wait_for("the namespace row", lambda: d.find_element(By.CSS_SELECTOR, 'tr[data-ns="default"]'))
    if ns.find_element(By.CSS_SELECTOR, "td[data-class]").text != "kv":
        fail(f"default's class: {ns.text!r}")
    cells = ns.find_elements(By.CSS_SELECTOR, "td[data-value]")
    if int(cells[0].get_attribute("data-value")) != BLOCKS:
        fail(f"namespace blocks: {cells[0].get_attribute('data-value')}")
    if int(cells[1].get_attribute("data-value")) != BLOCKS * BLOCK_BYTES:
        fail(f"namespace bytes: {cells[1].get_attribute('data-value')}")
    # A weights namespace (never evicted) shows its class.
    s, b = call(base, admin, "PUT", "/v1/namespaces/experts", b'{"class": "weights"}')
    if s != 201:
        fail(f"PUT a weights namespace: {s} {b[:200]!r}")

    def experts_class():
        row = d.find_element(By.CSS_SELECTOR, 'tr[data-ns="experts"] td[data-class]')
        return row.text == "weights" and row.text

    wait_for("the weights namespace's class", experts_class)
    node_row = d.find_element(By.CSS_SELECTOR, "#members tbody tr")
    if "ok" not in node_row.text:
        fail(f"node row: {node_row.text}")

    # The node's one flash tier ("device"), with the bytes the puts wrote to it.
    def device_tier():
        row = d.find_element(By.CSS_SELECTOR, '#tiers tr[data-tier="device"]')
        cells = row.find_elements(By.TAG_NAME, "td")
        return len(cells) == 9 and cells[5].text not in ("0 B", "–") and row.text

    wait_for("the node's tier and its writes", device_tier)

    # Bandwidth and p99 over a window with traffic: keep reading while the page polls.
    def busy_window():
        for i in range(40):
            call(base, admin, "GET", f"/v1/namespaces/default/blocks/{i:08x}")
        bw, p99 = text(d, "#m-bw"), text(d, "#m-p99")
        return bw.split(" · ")[0] not in ("0 B/s", "–") and p99.startswith("≤") and (bw, p99)
    bw, p99 = wait_for("live bandwidth and p99", busy_window)
    print(f"ui-check: live: bandwidth {bw}, p99 {p99}, hit ratio {text(d, '#m-hit')}")
    wait_for("the bandwidth chart", lambda: int(d.find_element(By.ID, "bw-read").get_attribute("data-points")) >= 2)

    # 3. The miss-ratio curve.
    def curve():
        p = d.find_element(By.ID, "mrc-line")
        pts = p.get_attribute("d").replace("M", "").split("L")
        ys = {round(float(q.split()[1]), 1) for q in pts}
        return int(p.get_attribute("data-points")) == 48 and len(ys) > 1
    wait_for("the miss-ratio curve", curve)

    # 4. The planner: the form's numbers are `ctxpod plan --json`'s.
    def plan_in_page(fields, reuse):
        form = d.find_element(By.ID, "plan-form")
        for name, v in fields.items():
            e = form.find_element(By.NAME, name)
            if e.tag_name == "select":
                Select(e).select_by_visible_text(v)
            else:
                e.clear()
                e.send_keys(str(v))
        Select(form.find_element(By.NAME, "reuse")).select_by_value(reuse)
        old = d.find_element(By.ID, "plan-result").get_attribute("innerHTML")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for("the plan", lambda: d.find_element(By.ID, "plan-out").is_displayed()
                 and d.find_element(By.ID, "plan-result").get_attribute("innerHTML") != old)
        return {e.get_attribute("id")[5:]: e.get_attribute("data-value")
                for e in d.find_elements(By.CSS_SELECTOR, "#plan-result td[id^=plan-]")}

    cases = [
        ({"model": "llama-3.1-70b", "rate": 12.5, "input_tokens": 9000, "sharing": 0.45,
          "retention_s": 900, "drive": "qlc", "drives": 8, "nics": 2, "nic_gbps": 400,
          "replication": 2, "target_hit_ratio": 0.3, "tokens_per_block": 512}, "sharing"),
        ({"model": "deepseek-v3", "rate": 40, "input_tokens": 20000, "sharing": 0.6,
          "retention_s": 3600, "drive": "tlc", "drives": 4, "nics": 1, "nic_gbps": 200,
          "replication": 1, "target_hit_ratio": 0.3, "tokens_per_block": 256}, "sharing"),
    ]
    for fields, reuse in cases:
        page = plan_in_page(fields, reuse)
        args = []
        for k, v in fields.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        cli = cli_plan(args)["plan"]
        if len(page) != 14:
            fail(f"plan rows: {sorted(page)}")
        for k, v in page.items():
            want = cli[k]
            got = v if isinstance(want, str) else (None if v == "null" else float(v))
            if got != want:
                fail(f"planner {fields['model']}: {k} is {v} on the page, {want} from ctxpod plan")
        print(f"ui-check: planner {fields['model']}: page == ctxpod plan "
              f"({cli['nodes']} nodes bound by {cli['bound_by']}, {cli['capacity_bytes']/1e12:.2f} TB)")
    # From the live curve: the curve it planned from is drawn.
    plan_in_page({"rate": 5, "input_tokens": 4096, "target_hit_ratio": 0.2}, "live")
    wait_for("the planned curve", lambda: int(d.find_element(By.ID, "plan-curve-line").get_attribute("data-points")) > 2)
    # Two tiers from the live curve: the fast tier serves its share of the planned hits.
    page = plan_in_page({"fast_drive": "slc", "fast_drives": 2, "fast_hit_share": 0.5}, "live")
    tiers = {k[len("tiers-"):]: float("inf") if v == "null" else float(v)
             for k, v in page.items() if k.startswith("tiers-")}
    hit = float(page["hit_ratio"])
    if (len(tiers) != 7 or abs(tiers["fast_hit_ratio"] - hit / 2) > 1e-9
            or abs(tiers["fast_hit_ratio"] + tiers["dense_hit_ratio"] - hit) > 1e-9):
        fail(f"planner tiers: {tiers} for a hit ratio of {hit}")
    print(f"ui-check: planner two tiers: fast {tiers['fast_capacity_bytes']/1e9:.2f} GB serves "
          f"{tiers['fast_hit_ratio']:.3f} of {hit:.3f}")

    # 5. Dark and light, a screenshot of each.
    def background():
        return d.execute_script("return getComputedStyle(document.body).backgroundColor")
    first = background()
    d.save_screenshot(os.path.join(ARTIFACTS, "dashboard-1.png"))
    d.find_element(By.ID, "theme").click()
    wait_for("the other theme", lambda: background() != first)
    d.save_screenshot(os.path.join(ARTIFACTS, "dashboard-2.png"))
    d.find_element(By.ID, "theme").click()
    wait_for("the first theme again", lambda: background() == first)

    # 6. Nothing in the console.
    logs = [l for l in d.get_log("browser") if l["level"] in ("SEVERE", "WARNING")]
    if logs:
        fail(f"browser console: {logs}")

    # 7. A tenant's token may not see the pod.
    d.find_element(By.ID, "signout").click()
    d.find_element(By.ID, "token").send_keys(tenant)
    d.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait_for("the refusal", lambda: "admin or a viewer" in text(d, "#login-error"))


if __name__ == "__main__":
    main()
