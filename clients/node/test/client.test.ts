// The TypeScript client against a real Runifold server it starts itself (test/support.ts):
// every RPC of the four services, the typed errors the server can be led to, and the
// README's examples. The fake model lets a concurrent writer in when a message says
// "[race:<namespace>:<conversation id>]", so that a turn deterministically loses the race.

// The cases are in one file per service (*.cases.ts), run here, in this order, against one
// server (stack.ts).

import "./transcript.cases.js";
import "./agent.cases.js";
import "./summary.cases.js";
import "./memory.cases.js";
import "./environment.cases.js";
import "./readme.cases.js";
