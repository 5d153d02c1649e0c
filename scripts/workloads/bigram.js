// Counts word pairs of a text in a JavaScript Map, then prints how many there are and the most
// frequent: a garbage-collected heap of many small objects.
const fs = require("fs");
const words = fs.readFileSync(process.argv[2], "utf8").split(/\s+/).filter((w) => w.length > 0);
const c = new Map();
for (let i = 1; i < words.length; i++) {
  const k = words[i - 1] + " " + words[i];
  c.set(k, (c.get(k) || 0) + 1);
}
let best = "", n = 0;
for (const [k, v] of c) {
  if (v > n || (v === n && k < best)) {
    best = k;
    n = v;
  }
}
console.log(`${c.size} pairs; most frequent: '${best}' ${n}`);
