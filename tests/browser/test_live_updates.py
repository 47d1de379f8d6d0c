"""Two people in two headless Chromium windows: one posts, the other sees it arrive without a
reload, the unread badge updates, and the page's polls were cache hits.  Screenshots of each step
go to test-artifacts/browser/."""
import os
import shutil
import tempfile
import time

import pytest
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(ROOT, "test-artifacts", "browser")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def browsers():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("Debian chromium and chromium-driver are not installed (make test installs them)")
    os.environ["SE_OFFLINE"] = "true"          # Selenium Manager must never download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    drivers, dirs = [], []

    def make():
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        profile = tempfile.mkdtemp(prefix="plurk-chrome-")
        dirs.append(profile)
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--no-first-run", "--window-size=900,1000", f"--user-data-dir={profile}"):
            opts.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
        driver.set_page_load_timeout(30)
        drivers.append(driver)
        return driver

    os.makedirs(ARTIFACTS, exist_ok=True)
    yield make
    for d in drivers:
        d.quit()
    for p in dirs:
        shutil.rmtree(p, ignore_errors=True)


def _wait(predicate, timeout=15, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _login(driver, base, username, password):
    from selenium.webdriver.common.by import By
    driver.get(base + "/login")
    driver.find_element(By.ID, "username").send_keys(username)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "#auth-form button").click()
    _wait(lambda: driver.current_url.rstrip("/") == base and
          driver.find_element(By.ID, "whoami").text == f"@{username}", what=f"{username} logged in")


def test_a_plurk_appears_for_a_follower_without_reload(stack, browsers):
    from selenium.webdriver.common.by import By

    base = stack.base_url
    names = {}
    for who in ("writer", "reader"):
        name = f"{who}{int(time.time() * 1000) % 10**8}"
        resp = requests.post(base + "/api/signup", json={"username": name, "password": "browser-pass-1"}, timeout=10)
        assert resp.status_code == 201
        names[who] = (name, resp.json()["token"])
    follow = requests.post(base + "/api/follow", json={"username": names["writer"][0]},
                           headers={"Authorization": f"Bearer {names['reader'][1]}"}, timeout=10)
    assert follow.status_code in (200, 201)

    writer, reader = browsers(), browsers()
    _login(writer, base, names["writer"][0], "browser-pass-1")
    _login(reader, base, names["reader"][0], "browser-pass-1")
    reader.save_screenshot(os.path.join(ARTIFACTS, "1-reader-before.png"))
    _wait(lambda: int(reader.find_element(By.TAG_NAME, "body").get_attribute("data-poll-hits")) >= 1,
          what="the reader's first poll")

    text = f"hello from the browser test {time.time():.0f}"
    box = writer.find_element(By.ID, "post-content")
    box.send_keys(text)
    assert writer.find_element(By.ID, "post-counter").text == f"{360 - len(text)} characters left"
    writer.find_element(By.CSS_SELECTOR, "#post-form button").click()
    _wait(lambda: text in writer.find_element(By.ID, "timeline").text, what="the writer's own plurk")
    writer.save_screenshot(os.path.join(ARTIFACTS, "2-writer-posted.png"))

    url_before = reader.current_url
    _wait(lambda: reader.find_element(By.ID, "badge").is_displayed() and
          reader.find_element(By.ID, "badge").text == "1", timeout=10, what="the unread badge")
    _wait(lambda: text in reader.find_element(By.ID, "timeline").text, timeout=10, what="the plurk for the reader")
    reader.save_screenshot(os.path.join(ARTIFACTS, "3-reader-sees-it.png"))
    assert reader.current_url == url_before                # no reload, no navigation
    # read after a few visible seconds: the badge clears
    _wait(lambda: not reader.find_element(By.ID, "badge").is_displayed(), timeout=15, what="badge cleared")
    reader.save_screenshot(os.path.join(ARTIFACTS, "4-reader-read.png"))

    body = reader.find_element(By.TAG_NAME, "body")
    hits, misses = int(body.get_attribute("data-poll-hits")), int(body.get_attribute("data-poll-misses"))
    assert hits >= 3
    assert hits / (hits + misses) >= 0.8, (hits, misses)
