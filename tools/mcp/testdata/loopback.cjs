// Preloaded (node --require) into an MCP server under test that listens on
// a port alone, such as server-everything's streamableHttp mode (PORT, no
// host): every listen without a host gets 127.0.0.1, so a test never
// opens a port to other machines, and the address taken is printed to
// stderr as "loopback-listening 127.0.0.1:PORT" for the test to read
// (PORT=0 picks a free port). The server's own code is not changed.
'use strict';
const net = require('node:net');

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'object' && args[0] !== null && !Array.isArray(args[0])) {
    if (args[0].path === undefined) args[0] = { ...args[0], host: '127.0.0.1' };
  } else if (typeof args[1] !== 'string' && /^\d+$/.test(String(args[0]))) {
    args.splice(1, 0, '127.0.0.1');
  }
  this.once('listening', () => {
    const a = this.address();
    if (a && typeof a === 'object') process.stderr.write(`loopback-listening ${a.address}:${a.port}\n`);
  });
  return listen.apply(this, args);
};
