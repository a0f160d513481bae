// One tenant's prompts move no other tenant's token counts once that tenant has its own.
import { describe, expect, it } from 'vitest';
import { BLOCK_CHARS_PER_TOKEN, EXPECTED_OUTPUT_TOKENS, promptBlocks } from '../../src/prompt/canonical.ts';
import { OWN_PROMPTS, TokenEstimates } from '../../src/prompt/tenant-estimates.ts';

const BLOCK = 16;
const chat = (content: string) =>
  promptBlocks({ kind: 'chat', messages: [{ role: 'user', content }] }, BLOCK);
/** A prompt of 1,200 characters the backend counts at `ratio` characters per token (plus the template's 7). */
const counted = (ratio: number) => [chat('x'.repeat(1200)), Math.round(1200 / ratio) + 7] as const;

describe('TokenEstimates', () => {
  it("a tenant dragging the ratio moves its own counts, not another tenant's that has its own", () => {
    const est = new TokenEstimates();
    for (let i = 0; i < OWN_PROMPTS; i++) est.learn('english', ...counted(4));
    const english = chat('The quick brown fox. '.repeat(100));
    const before = est.of('english').tokens(english);
    // Another tenant's prompts at about one character per token, many of them.
    for (let i = 0; i < 200; i++) est.learn('skew', ...counted(1));
    expect(est.of('skew').charsPerToken).toBeCloseTo(1, 1);
    expect(est.of('english').tokens(english)).toBe(before);
    // The fleet's ratio follows everyone's traffic (it sizes the prefix index).
    expect(est.fleet.charsPerToken).toBeLessThan(1.5);
  });

  it("a tenant with fewer than OWN_PROMPTS prompts of its own reads the fleet's figures", () => {
    const est = new TokenEstimates();
    expect(est.of('new').charsPerToken).toBe(BLOCK_CHARS_PER_TOKEN);
    for (let i = 0; i < 20; i++) est.learn('other', ...counted(2));
    for (let i = 0; i < OWN_PROMPTS - 1; i++) est.learn('new', ...counted(6));
    expect(est.of('new').charsPerToken).toBe(est.fleet.charsPerToken);
    est.learn('new', ...counted(6));
    expect(est.of('new').charsPerToken).toBeCloseTo(6, 1);
    // A tenant that never sent a prompt to learn from reads the fleet's.
    expect(est.of('silent')).toBe(est.fleet);
  });

  it("learns each tenant's output per sequence, from the fleet's until it has OWN_PROMPTS of its own", () => {
    const est = new TokenEstimates();
    expect(est.of('chatty').outputTokens).toBe(EXPECTED_OUTPUT_TOKENS);
    for (let i = 0; i < 50; i++) est.learnOutput('terse', 20);
    // 'chatty' has made no estimate of its own yet: the fleet's, taught by 'terse'.
    expect(est.of('chatty').outputTokens).toBeCloseTo(20, 0);
    for (let i = 0; i < OWN_PROMPTS - 1; i++) est.learnOutput('chatty', 900);
    expect(est.of('chatty').outputTokens).toBe(est.fleet.outputTokens);
    est.learnOutput('chatty', 900);
    expect(est.of('chatty').outputTokens).toBeCloseTo(900, 0);
    expect(est.of('terse').outputTokens).toBeCloseTo(20, 0);
    // Nothing that is not a count teaches.
    est.learnOutput('terse', Number.NaN);
    est.learnOutput('terse', -1);
    expect(est.of('terse').outputTokens).toBeCloseTo(20, 0);
  });

  it('forgets the tenants a reload removed', () => {
    const est = new TokenEstimates();
    for (let i = 0; i < OWN_PROMPTS; i++) est.learn('gone', ...counted(6));
    expect(est.of('gone')).not.toBe(est.fleet);
    est.retain(new Set(['kept']));
    expect(est.of('gone')).toBe(est.fleet);
    // Its requests still running when the reload came make no estimate of its own as they end.
    for (let i = 0; i < OWN_PROMPTS; i++) est.learn('gone', ...counted(6));
    expect(est.of('gone')).toBe(est.fleet);
    for (let i = 0; i < OWN_PROMPTS; i++) est.learn('kept', ...counted(6));
    expect(est.of('kept')).not.toBe(est.fleet);
  });
});
