package facts

import (
	"fmt"
	"math/big"
	"regexp"
	"strings"

	inf "gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The extender's quantity grammar (gpu_scheduler/quantity.py): apimachinery's, bounded.
// Where resource.ParseQuantity silently caps (9Ei) or truncates an exponent to int32,
// this refuses, with the extender's words, so both paths read one annotation alike.
var quantityShape = regexp.MustCompile(`^([+-]?)([0-9]*)(?:\.([0-9]*))?([KMGTPE]i|[numkMGTPE]?|[eE]([+-]?[0-9]+))$`)

const maxQuantityText = 128

var (
	decimalSI = map[string]int{"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
	binarySI  = map[string]uint{"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
	maxInt64  = new(big.Rat).SetInt64(1<<63 - 1)
)

// parseQuantity is the exact value of a quantity text, or the extender's reason why not.
func parseQuantity(text string) (*big.Rat, error) {
	if text == "" {
		return nil, fmt.Errorf("empty quantity")
	}
	if len([]rune(text)) > maxQuantityText {
		return nil, fmt.Errorf("quantity of %d characters is longer than %d", len([]rune(text)), maxQuantityText)
	}
	m := quantityShape.FindStringSubmatch(text)
	if m == nil {
		return nil, fmt.Errorf("not a quantity: %s (use e.g. 2, 500m, 40Gi, 80G or 1e3)", pyRepr(text))
	}
	negative, whole, fraction, suffix, exp := m[1] == "-", m[2], m[3], m[4], m[5]
	digits := strings.TrimLeft(whole+fraction, "0")
	if digits == "" {
		return new(big.Rat), nil
	}
	exp10, exp2 := -len(fraction), uint(0)
	switch {
	case exp != "":
		e, ok := new(big.Int).SetString(exp, 10)
		if !ok || !e.IsInt64() || e.Int64() < -(1<<31) || e.Int64() > 1<<31-1 {
			return nil, fmt.Errorf("quantity exponent in %s is beyond int32", pyRepr(text))
		}
		exp10 += int(e.Int64())
	case binarySI[suffix] != 0:
		exp2 = binarySI[suffix]
	default:
		exp10 += decimalSI[suffix]
	}
	if len(digits)+exp10+(int(exp2)*3+9)/10 > 20 {
		return nil, fmt.Errorf("quantity %s is beyond 2**63-1", pyRepr(text))
	}
	amount := new(big.Rat).SetInt(bigInt(digits))
	if exp2 == 0 && len(digits)+exp10 < -9 { // wholly below a nano: one nano, as upstream
		amount.SetFrac64(1, 1_000_000_000)
	} else {
		ten := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(exp10))), nil)
		if exp10 >= 0 {
			amount.Mul(amount, new(big.Rat).SetInt(ten))
		} else {
			amount.Quo(amount, new(big.Rat).SetInt(ten))
		}
		amount.Mul(amount, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), exp2)))
		if amount.Cmp(maxInt64) > 0 {
			return nil, fmt.Errorf("quantity %s is beyond 2**63-1", pyRepr(text))
		}
	}
	if negative {
		amount.Neg(amount)
	}
	return amount, nil
}

func bigInt(digits string) *big.Int {
	n, _ := new(big.Int).SetString(digits, 10)
	return n
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// MaxResource clamps CPU (millicores) and memory (MiB) figures, as the extender does.
const MaxResource = 1 << 40

// Down is q x factor rounded down, shifted right by shift bits, within 0..MaxResource:
// CPU as millicores (1000, 0) and memory as MiB (1, 20), as the extender reads them.
func Down(q *resource.Quantity, factor int64, shift uint) int64 {
	d := new(inf.Dec).Mul(q.AsDec(), inf.NewDec(factor, 0))
	d.Round(d, 0, inf.RoundDown)
	n := d.UnscaledBig()
	if n.Sign() <= 0 {
		return 0
	}
	n.Rsh(n, shift)
	if !n.IsInt64() || n.Int64() > MaxResource {
		return MaxResource
	}
	return n.Int64()
}
