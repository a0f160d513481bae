// Deterministic generated text. Token `index` of a request's output is a pure function of
// (request seed, index): the same seed gives the same text on any replica, under any load and
// whatever token ids the engine reports, so outputs can be compared across runs and policies.
//
// Tokens are drawn from a fixed set of common English words that are single cl100k tokens
// (with a leading space), with an occasional comma or full stop and a capital after each stop,
// so decoded output reads as word salad rather than random bytes. All ids are below 100,000,
// which Llama 3 shares with cl100k_base. The first token has no leading space, as a chat
// model's first word after the assistant header: sent back as an assistant message in the
// next turn (the template trims content), the text re-encodes to the very same ids, so the
// engine's cached output blocks serve the next turn's prefix as they do in vLLM. The engine
// is given generatedToken as its token-id function for exactly that.
//
// Output length when the model may stop on its own (`ignore_eos` false) is drawn from the
// seed too: lognormal with median 160 tokens and sigma 0.8 (mean ~220, a ShareGPT-like
// spread), clamped to [4, 2048]. The last token of such a stop is the end-of-turn token, which
// decodes to no text, as in vLLM's output.

import { EOT, sharedTokenizer } from '../tokenizer/tokenizer.ts';
import { Rng } from './rng.ts';

const WORDS = (
  'the of and to in is that for it as was with be by on not he this are or his from at which ' +
  'but have an they you were her she there one all we their been has when who will more no if ' +
  'out so said what up its about into than them can only other new some could time these two ' +
  'may then do first any my now such like our over man me even most made after also did many ' +
  'before must through back years where much your way well down should because each just those ' +
  'people how too little state good very make world still own see men work long here get both ' +
  'between life being under never day same another know while last might us great old year off ' +
  'come since against go came right used take three small large place again system number part ' +
  'water light point model data request server cache token answer question simple clear result'
).split(' ');

interface Piece {
  id: number;
  text: string;
}

function singleTokens(texts: readonly string[]): Piece[] {
  const pieces: Piece[] = [];
  for (const text of texts) {
    const ids = sharedTokenizer.encode(text);
    if (ids.length === 1) pieces.push({ id: ids[0] as number, text });
  }
  return pieces;
}

const LOWER = singleTokens(WORDS.map((w) => ` ${w}`));
const capital = (w: string) => `${w[0]?.toUpperCase()}${w.slice(1)}`;
const UPPER = singleTokens(WORDS.map((w) => ` ${capital(w)}`));
const FIRST = singleTokens(WORDS.map(capital));
const [COMMA, STOP] = singleTokens([',', '.']) as [Piece, Piece];
const TEXT_BY_ID = new Map<number, string>([
  ...[...LOWER, ...UPPER, ...FIRST, COMMA, STOP].map((p): [number, string] => [p.id, p.text]),
  [EOT, ''],
]);

/** 32-bit avalanche hash of (seed, index). */
function mix(seed: number, index: number): number {
  let z = (seed ^ Math.imul(index + 1, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

/** A punctuation slot never follows another one, so no ", ." pairs. */
function rawPunct(seed: number, index: number): boolean {
  return index > 0 && mix(seed, index) % 11 === 0;
}

function pieceAt(seed: number, index: number): Piece {
  const h = mix(seed, index);
  if (rawPunct(seed, index) && !rawPunct(seed, index - 1)) return (h >>> 12) % 3 === 0 ? STOP : COMMA;
  const afterStop =
    rawPunct(seed, index - 1) && !rawPunct(seed, index - 2) && (mix(seed, index - 1) >>> 12) % 3 === 0;
  const list = index === 0 ? FIRST : afterStop ? UPPER : LOWER;
  return list[(h >>> 4) % list.length] as Piece;
}

/** Token id of output token `index`; `eos` marks the end-of-turn token of a natural stop. */
export function generatedToken(seed: number, index: number, eos = false): number {
  return eos ? EOT : pieceAt(seed, index).id;
}

/** Text of a token produced by generatedToken (empty for the end-of-turn token). */
export function generatedText(tokenId: number): string {
  return TEXT_BY_ID.get(tokenId) ?? sharedTokenizer.decode([tokenId]);
}

/** How many tokens (end-of-turn included) the "model" writes when allowed to stop. */
export function naturalLength(seed: number): number {
  const draw = new Rng(seed ^ 0x5eed1e55).lognormal(160, 0.8);
  return Math.min(2048, Math.max(4, Math.round(draw)));
}

/** A request's seed: the body's `seed` when given, else a hash of the fleet seed and prompt. */
export function requestSeed(fleetSeed: number, promptTokens: readonly number[], bodySeed?: number): number {
  if (bodySeed !== undefined) {
    // int64 seeds: fold the high part in so distinct large seeds stay distinct.
    const hi = Math.floor(bodySeed / 4294967296);
    return (mix(bodySeed >>> 0, hi >>> 0) ^ 0x2545f491) >>> 0;
  }
  let h = (0x811c9dc5 ^ fleetSeed) >>> 0;
  for (const t of promptTokens) h = Math.imul(h ^ t, 0x01000193) >>> 0;
  return mix(h, promptTokens.length);
}
