import { countTokens, encode } from 'gpt-tokenizer/encoding/cl100k_base';
import { describe, expect, it } from 'vitest';
import { syntheticText, WORDS } from '../../src/bench/text.ts';
import {
  CODE,
  completionPrompt,
  createWorkload,
  MIXED,
  PREFIX_SHARED,
  SHAREGPT,
  takeRequests,
  WORKLOAD_NAMES,
  type WorkloadRequest,
} from '../../src/bench/workloads.ts';
import { Rng } from '../../src/sim/rng.ts';

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
};
const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(q * (s.length - 1))] as number;
};
const contentTokens = (r: WorkloadRequest) => r.messages.reduce((n, m) => n + countTokens(m.content), 0);

describe('synthetic text', () => {
  it('every word is one cl100k token, bare and after a space', () => {
    for (const w of WORDS) {
      expect(encode(w), w).toHaveLength(1);
      expect(encode(` ${w}`), w).toHaveLength(1);
    }
  });

  it('has exactly the asked number of tokens', () => {
    const rng = new Rng(5);
    for (const n of [0, 1, 2, 9, 21, 100, 777, 2048]) {
      expect(countTokens(syntheticText(rng, n))).toBe(n);
    }
  });
});

describe('workloads', () => {
  it('are a function of the seed', () => {
    for (const name of WORKLOAD_NAMES) {
      const a = takeRequests(createWorkload(name, 7), 40);
      expect(takeRequests(createWorkload(name, 7), 40), name).toEqual(a);
      expect(takeRequests(createWorkload(name, 8), 40), name).not.toEqual(a);
      expect(a.map((r) => r.index)).toEqual(Array.from({ length: 40 }, (_, i) => i));
    }
  });

  it('promptTokens is the real cl100k count of the message contents', () => {
    for (const name of WORKLOAD_NAMES) {
      for (const r of takeRequests(createWorkload(name, 3), 12)) {
        expect(contentTokens(r), name).toBe(r.promptTokens);
      }
    }
  });

  it('sharegpt: vLLM filter holds; means near 230 in / 203 out; heavy tails', () => {
    const rs = takeRequests(createWorkload('sharegpt', 11), 4000);
    const ins = rs.map((r) => r.promptTokens);
    const outs = rs.map((r) => r.outputTokens);
    for (const r of rs) {
      expect(r.promptTokens).toBeGreaterThanOrEqual(SHAREGPT.minLen);
      expect(r.outputTokens).toBeGreaterThanOrEqual(SHAREGPT.minLen);
      expect(r.promptTokens).toBeLessThanOrEqual(1024);
      expect(r.promptTokens + r.outputTokens).toBeLessThanOrEqual(2048);
    }
    expect(mean(ins)).toBeGreaterThan(215);
    expect(mean(ins)).toBeLessThan(245);
    expect(mean(outs)).toBeGreaterThan(190);
    expect(mean(outs)).toBeLessThan(216);
    // Heavy tails: the mean sits well above the median and p99 is many medians out.
    expect(mean(ins) / median(ins)).toBeGreaterThan(1.3);
    expect(quantile(ins, 0.99) / median(ins)).toBeGreaterThan(4);
    expect(quantile(outs, 0.99) / median(outs)).toBeGreaterThan(4);
    expect(rs.every((r) => r.messages.length === 1 && r.messages[0]?.role === 'user')).toBe(true);
    // Distinct prompts: no accidental prefix sharing beyond a few words.
    const heads = new Set(rs.slice(0, 500).map((r) => r.messages[0]?.content.slice(0, 60)));
    expect(heads.size).toBe(500);
  });

  it('code: median prompt ~1500, median output ~15, mean output ~23 (Azure code trace)', () => {
    const rs = takeRequests(createWorkload('code', 5), 1500);
    const ins = rs.map((r) => r.promptTokens);
    const outs = rs.map((r) => r.outputTokens);
    expect(median(ins)).toBeGreaterThan(1350);
    expect(median(ins)).toBeLessThan(1650);
    expect(median(outs)).toBeGreaterThanOrEqual(12);
    expect(median(outs)).toBeLessThanOrEqual(18);
    expect(mean(outs)).toBeGreaterThan(19);
    expect(mean(outs)).toBeLessThan(27);
    expect(Math.min(...ins)).toBeGreaterThanOrEqual(CODE.inputMin);
    expect(Math.max(...ins)).toBeLessThanOrEqual(CODE.inputMax);
    expect(rs.every((r) => r.classHint === 'completion')).toBe(true);
  });

  it('mixed: ~15% long documents of 4k–8k tokens, the rest short chats', () => {
    const rs = takeRequests(createWorkload('mixed', 2), 2000);
    const docs = rs.filter((r) => r.classHint === 'batch');
    const share = docs.length / rs.length;
    expect(share).toBeGreaterThan(MIXED.documentShare - 0.03);
    expect(share).toBeLessThan(MIXED.documentShare + 0.03);
    for (const d of docs) {
      expect(d.promptTokens).toBeGreaterThanOrEqual(4096);
      expect(d.promptTokens).toBeLessThanOrEqual(8192);
    }
    const chats = rs.filter((r) => r.classHint === 'interactive');
    expect(chats.length + docs.length).toBe(rs.length);
    expect(Math.max(...chats.map((r) => r.promptTokens))).toBeLessThanOrEqual(1024);
  });

  it('mixed: its chats follow the sharegpt parameters given', () => {
    const rs = takeRequests(createWorkload('mixed', 2, { sharegpt: { maxPrompt: 64 } }), 500);
    const chats = rs.filter((r) => r.classHint === 'interactive');
    expect(chats.length).toBeGreaterThan(300);
    expect(Math.max(...chats.map((r) => r.promptTokens))).toBeLessThanOrEqual(64);
  });

  it('prefix-shared: tenants share long system prompts; later turns resend the history', () => {
    const rs = takeRequests(createWorkload('prefix-shared', 4), 600);
    const systemByTenant = new Map<string, string>();
    for (const r of rs) {
      const system = r.messages[0];
      expect(system?.role).toBe('system');
      const tenant = r.tenant as string;
      const known = systemByTenant.get(tenant);
      if (known === undefined) systemByTenant.set(tenant, system?.content as string);
      else expect(system?.content).toBe(known);
    }
    expect(systemByTenant.size).toBe(PREFIX_SHARED.tenants);
    for (const text of systemByTenant.values()) {
      const n = countTokens(text);
      expect(n).toBeGreaterThanOrEqual(1800);
      expect(n).toBeLessThanOrEqual(2200);
    }
    expect(new Set(systemByTenant.values()).size).toBe(PREFIX_SHARED.tenants);

    // Turns of one session arrive in order, each one extending the previous request's messages.
    const bySession = new Map<string, WorkloadRequest[]>();
    for (const r of rs)
      bySession.set(r.sessionId as string, [...(bySession.get(r.sessionId as string) ?? []), r]);
    let multiTurn = 0;
    for (const turns of bySession.values()) {
      for (let i = 1; i < turns.length; i++) {
        const prev = turns[i - 1] as WorkloadRequest;
        const cur = turns[i] as WorkloadRequest;
        expect(cur.messages.slice(0, prev.messages.length)).toEqual(prev.messages);
        expect(cur.messages).toHaveLength(prev.messages.length + 2);
        expect(cur.messages[prev.messages.length]?.role).toBe('assistant');
        multiTurn++;
      }
    }
    expect(multiTurn).toBeGreaterThan(200);
    // Most prompt tokens are a prefix some earlier request already sent.
    const shared = rs.reduce((n, r) => n + countTokens(r.messages[0]?.content as string), 0);
    expect(shared / rs.reduce((n, r) => n + r.promptTokens, 0)).toBeGreaterThan(0.5);
    for (const r of rs) {
      expect(r.outputTokens).toBeGreaterThanOrEqual(100);
      expect(r.outputTokens).toBeLessThanOrEqual(300);
    }
  });

  it('the completions prompt keeps shared prefixes shared', () => {
    const [a, b] = takeRequests(
      createWorkload('prefix-shared', 1, { 'prefix-shared': { tenants: 1 } }),
      2,
    ) as [WorkloadRequest, WorkloadRequest];
    const system = a.messages[0]?.content as string;
    expect(completionPrompt(a.messages).startsWith(system)).toBe(true);
    expect(completionPrompt(b.messages).startsWith(system)).toBe(true);
  });
});
