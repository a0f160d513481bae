// Synthetic prompt text whose cl100k token count is known by construction, so a workload can
// ask for "a 1,500-token prompt" without tokenizing anything at run time.
//
// Invariant: every entry of WORDS is exactly one cl100k token both bare and with a leading
// space, and "." is one token. cl100k's pre-tokenizer splits " word" and "." into separate
// pieces before BPE, so a text of k words and p periods is exactly k + p tokens (the test
// suite checks this with the real tokenizer).
import type { Rng } from '../sim/rng.ts';

export const WORDS: readonly string[] = [
  'the of and to in is was for on that with as by at from his it an were are which this be has or',
  'had not but first one their its new after who they have her she two been other when there all',
  'during into school time may years more most only over city some world would where later up such',
  'used many can state about national out known then made age under team three between american',
  'called while game since year part well both people series film season before through music war',
  'including life being high them government work south however located until four north west best',
  'born second family number end back another each early following released name member against',
  'county district general these club group home area long de album played no john so town same',
  'five us along among because around river system within show public international league way',
  'local different region day any list great did top include major human place last period form men',
  'history do without population church line small head based even old final though left order set',
  'six due very make like former using much water point party career case air use large power what',
  'union also',
]
  .join(' ')
  .split(' ');

/** Random sentences of exactly `tokens` cl100k tokens (words plus a period every 8–20 words). */
export function syntheticText(rng: Rng, tokens: number): string {
  let out = '';
  let count = 0;
  let inSentence = 0;
  let sentenceLength = rng.int(8, 20);
  while (count < tokens) {
    if (inSentence >= sentenceLength) {
      out += '.';
      inSentence = 0;
      sentenceLength = rng.int(8, 20);
    } else {
      out += (count === 0 ? '' : ' ') + rng.pick(WORDS);
      inSentence++;
    }
    count++;
  }
  return out;
}
