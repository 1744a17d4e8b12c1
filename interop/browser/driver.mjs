// Drives the test page in Debian's headless Chromium with playwright-core
// for test_browser.py and test_console.py: argv[2] is the page URL; each stdin line is a JSON
// {"id", "expr"} whose expression (it may return a promise) is evaluated in
// the page, or {"id", "screenshot": path} which saves a PNG of the whole
// page there; each answer is one stdout line {"id", "ok", "value"|"error"}.
// Page console output goes to stderr.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

const url = process.argv[2];
// argv[3]: the expression that says the page is ready (test_console.py's
// page is not page.html); default: page.html's.
const ready = process.argv[3] || "document.title === 'ready' && window.mqtt && window.StompJs";
const profile = mkdtempSync(join(tmpdir(), "rosetta-chromium-"));
const send = (o) => process.stdout.write(JSON.stringify(o) + "\n");

let context;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  const page = context.pages()[0] || (await context.newPage());
  page.on("console", (m) => process.stderr.write(`[page ${m.type()}] ${m.text()}\n`));
  page.on("pageerror", (e) => process.stderr.write(`[page error] ${e.message}\n`));
  await page.goto(url);
  await page.waitForFunction(ready);
  send({ id: 0, ok: true, value: await page.evaluate(() => navigator.userAgent) });

  for await (const line of createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    const { id, expr, screenshot } = JSON.parse(line);
    try {
      if (screenshot) {
        await page.screenshot({ path: screenshot, fullPage: true });
        send({ id, ok: true, value: screenshot });
        continue;
      }
      send({ id, ok: true, value: await page.evaluate(expr) });
    } catch (e) {
      send({ id, ok: false, error: String(e && e.message ? e.message : e) });
    }
  }
} catch (e) {
  send({ id: 0, ok: false, error: String(e && e.stack ? e.stack : e) });
} finally {
  if (context) await context.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}
