"""SGLang: `launch` (the server command line and GPU split), and, behind the engine interface, how
the proxy talks to it and how its weights are updated."""
