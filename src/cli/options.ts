// What the commands' option parsing shares.

/**
 * The first of `names` given an empty (or blank) value, if any. An empty value is a slip (an unset
 * variable: `--port=$PORT`, `--model=`), never a choice: Number('') is 0, and an empty name says
 * nothing. A command refuses it as a usage error.
 */
export function emptyOption(
  values: Readonly<Record<string, unknown>>,
  names: readonly string[],
): string | undefined {
  return names.find((name) => {
    const value = values[name];
    return typeof value === 'string' && value.trim() === '';
  });
}
