"""The pools user code runs on, one interface for every runtime (``pool.Pool``): the loop
(``loop``), a thread pool (``threads``) and a process pool (``processes``, with the gate's
copy its children read in ``shared``). Each runs a call for a lease or a key range under the
ownership gate, says how it ended, stops what can be stopped, waits until stopped calls are
over, and shuts down; the runtimes keep what is theirs (the worker's attempts and failure
policies, the streams' tasks and rounds)."""
