"""Lower bounds on the step time, valid for every plan the verifier accepts."""
