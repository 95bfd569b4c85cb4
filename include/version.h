/* The release this binary is: `--version`, and the contract document. */
#ifndef IDEMPROXY_VERSION_H
#define IDEMPROXY_VERSION_H

#ifndef IDEMPROXY_VERSION
#define IDEMPROXY_VERSION "0.1.0"
#endif

#endif
