// Debian's headless Chromium through playwright-core, with a fresh profile directory (removed when
// the browser closes) and the flags that keep it off the network and quiet (no sandbox: tests run
// as root in CI).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BrowserContext, chromium } from 'playwright-core';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

export async function launchChromium(
  viewport: { width: number; height: number } = { width: 1280, height: 800 },
): Promise<BrowserContext> {
  const profile = mkdtempSync(join(tmpdir(), 'slagate-chromium-'));
  try {
    const browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
      ],
    });
    // Closing the browser removes its profile (once Chromium has let go of it).
    const close = browser.close.bind(browser);
    browser.close = async (options) => {
      await close(options);
      rmSync(profile, { recursive: true, force: true });
    };
    return browser;
  } catch (err) {
    rmSync(profile, { recursive: true, force: true });
    throw err;
  }
}
