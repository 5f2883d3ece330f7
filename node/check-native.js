// `npm pack` runs this first (package.json's prepack): a package without its two native files
// installs, then fails at run time and has no `hermes-guard` command. Stops the pack, saying
// how to make a whole one.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const needed = ['native/libhermes_guard.so', 'native/hermes-guard'];
const missing = needed.filter((f) => !fs.existsSync(path.join(__dirname, f)));
if (missing.length > 0) {
  console.error(
    `hermes-guard: not packing: ${missing.join(' and ')} missing, and the package cannot work ` +
      'without them. From the repository root, build them and pack with node/pack.sh:\n' +
      '  cargo build --release && cargo build --release -p hermes-guard-ext\n' +
      '  bash node/pack.sh target/release/libhermes_guard.so target/release/hermes-guard <destination>\n' +
      '(node/README.md, "Building the package")',
  );
  process.exit(1);
}
